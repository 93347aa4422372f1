"""Generation and evaluation that cannot fit the model are refused before anything compiles: a prompt plus
eval.max_new_tokens past the context, eval.max_new_tokens < 1, eval rows longer than eval.window;
S5's position-aligned generations hold at most eval.max_new_tokens."""

import dataclasses
import json
import os
import random

import numpy as np
import pytest

from t2mlr_jax.config.edit import config_module
from t2mlr_jax.data.batch import RECURRENT
from t2mlr_jax.data.char_tokenizer import S5CharTokenizer
from t2mlr_jax.data.s5_retrieval import S5RetrievalConfig, encode_s5_retrieval, make_s5_retrieval_example
from t2mlr_jax.experiment import resolve
from t2mlr_jax.train.build_data import build_data_source
from t2mlr_jax.train.data_source import check_generation
from t2mlr_jax.train.dump_generations import aligned_record
from tests.test_main import ROOT, main
from tests.tiny import tiny_experiment
from tests.train.tiny_task import tiny_source

GSM8K = os.path.join(ROOT, "configs", "gsm8k.py")
GSM8K_SAMPLE = os.path.join(ROOT, "configs", "samples", "gsm8k_aug.jsonl")


def _eval(generate=True, max_new_tokens=8):
    """The library's eval section (greedy), with these two fields."""
    return dataclasses.replace(
        resolve(tiny_experiment()).eval, generate=generate, max_new_tokens=max_new_tokens
    )


def _prompts(*lengths):
    """A tiny task whose generation prompts have these lengths."""
    examples = [{"prompt": np.ones(n, np.int32)} for n in lengths]
    return tiny_source()._replace(generation_examples=lambda: iter(examples))


@pytest.mark.parametrize("max_new_tokens", [0, -1])
def test_max_new_tokens_below_one_is_an_error_naming_the_field(max_new_tokens):
    with pytest.raises(ValueError, match=f"eval.max_new_tokens must be >= 1, got {max_new_tokens}"):
        check_generation(_prompts(4), _eval(max_new_tokens=max_new_tokens), max_seq_len=64)


def test_a_prompt_that_leaves_no_room_for_the_new_tokens_is_refused_by_index():
    check_generation(_prompts(10, 56), _eval(), max_seq_len=64)  # 56 + 8 = 64: exactly fits
    with pytest.raises(
        ValueError,
        match="generation example 1 has a 57-token prompt: with max_new_tokens 8 it needs 65 positions, "
        "more than the model's context of 64",
    ):
        check_generation(_prompts(10, 57, 100), _eval(), max_seq_len=64)
    check_generation(_prompts(1000), _eval(), max_seq_len=None)  # an architecture without a context limit


def test_prompts_are_checked_only_when_generation_eval_is_on():
    check_generation(_prompts(1000), _eval(generate=False), max_seq_len=64)  # never generated from
    with pytest.raises(ValueError, match="eval.generate is on but this task has no prompts"):
        check_generation(tiny_source(), _eval(), max_seq_len=64)


def test_the_library_entry_point_refuses_before_compiling():
    from t2mlr_jax.architectures import Architecture
    from t2mlr_jax.train.eval import evaluate_generation

    def never(*args):
        raise AssertionError("generate was traced")

    arch = Architecture("fake", {}, "float32", never, never, max_seq_len=16)
    examples = [{"prompt": np.ones(n, np.int32)} for n in (4, 12)]
    with pytest.raises(ValueError, match="generation example 1 has a 12-token prompt"):
        evaluate_generation(
            arch,
            {},
            {},
            examples,
            decode=str,
            score=lambda text, example: True,
            max_new_tokens=5,
            eos_id=None,
            pad_id=0,
            batch_size=2,
        )


def _config(name: str, preset: str = "cpu", **data):
    config = config_module(os.path.join(ROOT, "configs", f"{name}.py")).get_config(preset)
    config.data.update(data)
    return config


def _eval_file(tmp_path, long_prompt_words: int) -> str:
    """The GSM8K sample with one long question as record 2."""
    rows = [json.loads(line) for line in open(GSM8K_SAMPLE)][:4]
    rows[2]["question"] = " ".join(["apple"] * long_prompt_words)
    path = tmp_path / "eval.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


TOO_LONG = {  # config: (eval.window, how the error starts); gsm8k:cpu eval rows are data.seq_len 96
    "gsm8k": (0, "eval example 2 of .*eval.jsonl is 2\\d\\d tokens"),
    "variable_assignment": (40, "eval example 0 is \\d+ tokens"),
    "s5_retrieval_t2mlr": (20, "S5-retrieval eval examples reach \\d+ tokens"),
}


@pytest.mark.parametrize("name", sorted(TOO_LONG))
def test_eval_rows_longer_than_an_eval_row_are_refused_when_the_data_is_built(tmp_path, name):
    window, message = TOO_LONG[name]
    config = _config(name, **({"eval_path": _eval_file(tmp_path, 200)} if name == "gsm8k" else {}))
    config.eval.window = window
    with pytest.raises(ValueError, match=f"{message}, longer than an eval row \\(\\d+ tokens: eval.window"):
        build_data_source(resolve(config), train=False)


@pytest.mark.slow
def test_main_refuses_generation_past_the_context_in_one_line_before_compiling(tmp_path):
    """Every eval row fits a 256-position context (eval.window 256), but prompt 2 (201 tokens) + 64
    does not."""
    out = main(
        f"--config={GSM8K}:cpu",
        f"--config.data.eval_path={_eval_file(tmp_path, 200)}",
        "--config.eval.window=256",
        "--config.model.max_seq_len=256",
        "--config.eval.max_new_tokens=64",
        f"--workdir={tmp_path / 'run'}",
    )
    assert out.returncode == 2, out.stderr[-2000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "generation example 2 has a" in errors[0], out.stderr[-2000:]
    assert "lower eval.max_new_tokens" in errors[0]
    assert "Traceback" not in out.stderr and "Compiling" not in out.stderr
    assert not (tmp_path / "run").exists()


def test_s5_generations_are_the_first_max_new_tokens_of_each_answer():
    """S5 predicts every answer position in one forward; --mode=generate ignored eval.max_new_tokens and
    wrote whole answers. Now a generation holds the answer's first max_new_tokens tokens, and one cut short
    is not correct; the S5 config leaves room for its longest test answer (48 actions x 5 tokens)."""
    tokenizer = S5CharTokenizer()
    config = S5RetrievalConfig(max_actions=3, value_len=1, full_dict=False, moved_points=2)
    example = encode_s5_retrieval(make_s5_retrieval_example(random.Random(0), 2, config), tokenizer)
    tokens, targets = example["tokens"], example["targets"]
    scored, seen = example["control_flow"] == RECURRENT, np.ones(len(tokens), bool)
    answer = targets[scored]
    assert len(answer) == 3 * (1 + 1)  # N = 3 actions x (state + one value char)

    def generation(max_new_tokens):  # a model that predicts every target
        return aligned_record(tokens, targets, targets, scored, seen, tokenizer.decode, max_new_tokens)

    assert (
        generation(64)
        == generation(6)
        == {
            "input": tokenizer.decode(tokens),
            "prediction": tokenizer.decode(answer),
            "target": tokenizer.decode(answer),
            "correct": True,
        }
    )
    cut = generation(4)
    assert cut["prediction"] == tokenizer.decode(answer[:4]) and not cut["correct"]
    s5 = config_module(os.path.join(ROOT, "configs", "s5_retrieval_t2mlr.py")).get_config(None)
    assert s5.eval.max_new_tokens == 48 * (1 + s5.data.options.value_len)
