"""tools/train_tokenizer.py: a tiny byte-level BPE trained on a temp corpus loads with load_tokenizer,
round-trips text, and its token byte lengths sum to the UTF-8 length; bad input is one error line."""

import json
import os
import re

import pytest

from t2mlr_jax.data.tokenizer import load_tokenizer
from tests.data.test_tools import load_tool

TEXT = (
    "From fairest creatures we desire increase, that thereby beauty's rose might never die. "
    "Héllo wörld ✓ 日本 — 12345 naïve café. "
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    (folder / "nested").mkdir()
    (folder / "a.txt").write_text(TEXT * 20, encoding="utf-8")
    (folder / "nested" / "b.jsonl").write_text(
        "\n".join(json.dumps({"text": f"Document {i}: {TEXT}"}) for i in range(10)), encoding="utf-8"
    )
    return folder


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("tok") / "out"
    assert (
        load_tool("train_tokenizer").main(["--input", str(corpus), "--out", str(out), "--vocab_size", "300"])
        == 0
    )
    return out


def test_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        load_tool("train_tokenizer").main(["--help"])
    assert exit_info.value.code == 0 and "--vocab_size" in capsys.readouterr().out


def test_trained_tokenizer_loads_round_trips_and_counts_bytes(trained):
    assert sorted(os.listdir(trained)) == [
        "tokenizer.json",
        "tokenizer_config.json",
        "tokenizer_summary.json",
    ]
    tokenizer = load_tokenizer(str(trained))
    summary = json.loads((trained / "tokenizer_summary.json").read_text())
    assert tokenizer.vocab_size == summary["vocab_size"] == 300 and summary["documents"] == 11
    assert tokenizer.eos_id == summary["eos_id"] == 0 and summary["special_tokens"]["<|im_end|>"] == 2
    assert 1.0 < summary["bytes_per_token"] < 8.0
    for text in (TEXT, "unseen: ∑ ü 🤗 \n\t x", "<|im_start|>user\nhi<|im_end|>"):
        ids = tokenizer.encode(text)
        assert tokenizer.decode(ids) == text
        specials = text.count("<|im_start|>") * 12 + text.count("<|im_end|>") * 10
        assert int(tokenizer.byte_lengths[ids].sum()) == len(text.encode("utf-8")) - specials
    assert len(tokenizer.encode("<|im_start|>")) == 1 and tokenizer.byte_lengths[:3].tolist() == [0, 0, 0]
    assert len(tokenizer.encode(TEXT)) < len(TEXT.encode("utf-8")) / 1.5  # merges were learnt


def test_eos_token_and_max_chars(corpus, tmp_path):
    out = tmp_path / "bos"
    argv = ["--input", str(corpus / "a.txt"), "--out", str(out), "--vocab_size", "270", "--max_chars", "500"]
    assert load_tool("train_tokenizer").main(argv + ["--eos_token", "<|bos|>", "--special_tokens"]) == 0
    summary = json.loads((out / "tokenizer_summary.json").read_text())
    assert summary["characters"] == 500 and summary["special_tokens"] == {"<|bos|>": 0}
    assert load_tokenizer(str(out)).eos_id == 0


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--input", "{tmp}/missing"], "does not exist"),
        (["--input", "{tmp}/empty.txt"], "is empty"),
        (["--input", "{tmp}/blank.txt"], "the corpus is empty"),
        (["--input", "{tmp}/blank.txt", "--vocab_size", "258"], "too small: .* = 259"),
        (["--input", "{tmp}/latin1.txt"], "not UTF-8"),
        (["--input", "{tmp}/blank.txt", "--out", "{tmp}/blank.txt"], "is a file"),
    ],
)
def test_bad_input_is_one_error_line_and_writes_nothing(tmp_path, capsys, argv, message):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "blank.txt").write_text(" \n\n ")
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))
    argv = [a.format(tmp=tmp_path) for a in argv]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "out")]
    assert load_tool("train_tokenizer").main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and re.search(message, err[0]), err
    assert not os.path.exists(tmp_path / "out")


def test_existing_output_needs_overwrite(trained, corpus, capsys):
    argv = ["--input", str(corpus / "a.txt"), "--out", str(trained), "--vocab_size", "300"]
    assert load_tool("train_tokenizer").main(argv) == 2
    assert "--overwrite" in capsys.readouterr().err
