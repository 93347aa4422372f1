"""The CLIs in tools/: --help, and files that the pipelines read back."""

import importlib.util
import json
import os
import re
import shlex

import numpy as np
import pytest

from t2mlr_jax.data.pipeline import load_records
from t2mlr_jax.data.tasks import GeneratedTaskSource
from t2mlr_jax.data.token_store import TokenStoreSource, read_metadata

TOOLS = os.path.join(os.path.dirname(__file__), "..", "..", "tools")


def load_tool(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(TOOLS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["make_dataset", "prepare_text"])
def test_help(name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        load_tool(name).main(["--help"])
    assert exit_info.value.code == 0 and "usage:" in capsys.readouterr().out


def test_make_dataset_help_examples_are_complete_commands(capsys):
    """Every example in --help names the required flags (--out included) and only flags the tool has."""
    with pytest.raises(SystemExit):
        load_tool("make_dataset").main(["--help"])
    text = capsys.readouterr().out
    description = text.partition("Example:")[2]
    examples = [
        shlex.split(command.replace("\\\n", " "))
        for command in re.findall(r"python tools/make_dataset\.py(?:[^\n]*\\\n)*[^\n]*", description)
    ]
    assert len(examples) == 2
    known = set(re.findall(r"--\w+", text.split("options:")[-1]))
    for argv in examples:
        flags = {a for a in argv if a.startswith("--")}
        assert {"--task", "--num_examples", "--out"} <= flags <= known, argv


def test_make_dataset_writes_jsonl_and_array_record(tmp_path):
    out = str(tmp_path / "prosqa")
    assert (
        load_tool("make_dataset").main(
            [
                "--task",
                "prosqa",
                "--split",
                "validation",
                "--num_examples",
                "3",
                "--seed",
                "7",
                "--out",
                out,
                "--set",
                "max_path=8",
            ]
        )
        == 0
    )
    expected = [
        GeneratedTaskSource("prosqa", "validation", seed=7, num_examples=3, max_path=8)[i] for i in range(3)
    ]
    from_jsonl = load_records(os.path.join(out, "validation.jsonl"))
    from_array_record = load_records(os.path.join(out, "validation.array_record"))
    assert from_jsonl == expected and [from_array_record[i] for i in range(3)] == expected


def test_make_dataset_rejects_bad_options(tmp_path, capsys):
    with pytest.raises(SystemExit):
        load_tool("make_dataset").main(
            [
                "--task",
                "s5_retrieval",
                "--num_examples",
                "2",
                "--out",
                str(tmp_path),
                "--set",
                "no_such_field=1",
            ]
        )
    assert "bad option" in capsys.readouterr().err


def test_prepare_text_writes_a_token_store(tmp_path, tokenizer_dir, smollm2):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("First document, with some words.")
    (docs / "b.jsonl").write_text(
        json.dumps({"text": "Second."})
        + "\n"
        + json.dumps({"text": ""})
        + "\n"
        + json.dumps({"text": "Third one!"})
    )
    out = str(tmp_path / "store")
    assert (
        load_tool("prepare_text").main(
            [
                "--input",
                str(docs),
                "--output_dir",
                out,
                "--tokenizer",
                tokenizer_dir,
                "--documents_per_shard",
                "2",
            ]
        )
        == 0
    )
    meta = read_metadata(out)
    assert (meta.num_documents, len(meta.files), meta.eos_id, meta.vocab_size) == (3, 2, 2, 49152)
    source = TokenStoreSource(out, vocab_size=49152)
    texts = ["First document, with some words.", "Second.", "Third one!"]
    assert all(np.array_equal(source[i], smollm2.encode(t)) for i, t in enumerate(texts))


def test_prepare_text_fails_fast_on_bad_input(tmp_path, tokenizer_dir, capsys):
    (tmp_path / "empty.txt").write_text("")
    for argv in (["--input", str(tmp_path / "nope")], ["--input", str(tmp_path / "empty.txt")]):
        with pytest.raises(SystemExit):
            load_tool("prepare_text").main(
                argv + ["--output_dir", str(tmp_path / "o"), "--tokenizer", tokenizer_dir]
            )
    err = capsys.readouterr().err
    assert "does not exist" in err and "is empty" in err
    assert not os.path.exists(tmp_path / "o")
