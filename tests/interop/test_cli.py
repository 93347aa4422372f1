"""tools/convert_checkpoint.py: --help names every direction; conversions round-trip and --verify reports."""

import json
from pathlib import Path

import pytest
import torch

from t2mlr_jax.formats.files import read_state_dict, torch_state
from t2mlr_jax.interop import load_params, save_params
from t2mlr_jax.studies.parity import relative_bound
from tests.in_process import run_tool
from tests.interop.helpers import (
    state_dicts_identical,
    tiny_llama_config,
    transformers_model,
    trees_identical,
)
from tests.tiny import interop_config, random_params
from tests.tolerance import record

TOOL = Path(__file__).parents[2] / "tools" / "convert_checkpoint.py"


def convert(*argv) -> int:
    return run_tool(TOOL, *argv)


def test_help_lists_every_direction(capsys):
    assert convert("--help") == 0
    text = capsys.readouterr().out
    for name in (
        "hf | gguf | t2mlr-torch | nanochat  ->  orbax",
        "orbax  ->  hf | t2mlr-torch | nanochat",
        "--verify",
        "--drop-recurrence",
    ):
        assert name in text


def test_unsupported_direction_is_refused(tmp_path, capsys):
    assert convert("--from", "hf", "--to", "t2mlr-torch", tmp_path / "a", tmp_path / "b") == 2
    assert "one side must be orbax" in capsys.readouterr().err


def check_verify(report: dict, layers: int, what: str) -> None:
    """--verify's report (ours against the torch model on its tokens) within the depth rule for a path of
    `layers` layers, recorded as every parity check is (tests/interop/helpers.py)."""
    record(what, report["max_rel_logit_diff"], relative_bound(layers))
    assert report["passed"] and report["max_rel_logit_diff"] <= relative_bound(layers), report


@pytest.mark.numerics
def test_hf_round_trip_with_verify(tmp_path, capsys):
    transformers_model(tiny_llama_config(kv_heads=2, tied=False)).save_pretrained(tmp_path / "hf")
    assert (
        convert(
            "--from", "hf", "--to", "orbax", tmp_path / "hf", tmp_path / "ckpt", "--verify", "--seq-len", 8
        )
        == 0
    )
    assert convert("--from", "orbax", "--to", "hf", tmp_path / "ckpt", tmp_path / "back") == 0
    assert state_dicts_identical(read_state_dict(tmp_path / "hf"), read_state_dict(tmp_path / "back"))
    report = json.loads((tmp_path / "ckpt.verify.json").read_text())
    check_verify(report, 3, "--verify hf")  # tiny_llama_config: 3 layers
    assert report["torch_format"] == "hf"
    assert "max |logit difference|" in capsys.readouterr().out


def test_t2mlr_export_and_import_with_verify(tmp_path, capsys):
    cfg = interop_config()
    params = random_params(cfg, 1)
    save_params(tmp_path / "ckpt", cfg, params)
    report = tmp_path / "report.json"
    assert (
        convert(
            "--from",
            "orbax",
            "--to",
            "t2mlr-torch",
            tmp_path / "ckpt",
            tmp_path / "t2mlr",
            "--verify",
            "--report",
            report,
            "--seq-len",
            6,
        )
        == 0
    )
    assert json.loads(report.read_text())["mode"] == "exact" and json.loads(report.read_text())["passed"]
    assert convert("--from", "t2mlr-torch", "--to", "orbax", tmp_path / "t2mlr", tmp_path / "again") == 0
    cfg_back, params_back = load_params(tmp_path / "again")
    assert cfg_back == cfg and trees_identical(params_back, params)
    assert convert("--from", "orbax", "--to", "hf", tmp_path / "ckpt", tmp_path / "hf") == 2
    assert "--drop-recurrence" in capsys.readouterr().err
    assert (
        convert(
            "--from",
            "orbax",
            "--to",
            "hf",
            tmp_path / "ckpt",
            tmp_path / "hf",
            "--drop-recurrence",
            "--verify",
            "--seq-len",
            6,
        )
        == 0
    )


@pytest.mark.numerics
def test_nanochat_round_trip_with_verify(tmp_path):
    """The LRT release's checkpoint (tests/interop/fixtures/lrt_release_vanilla) to orbax and back, each way
    verified against the PyTorch reference; the export is the release's file, padding rows zeroed."""
    release = Path(__file__).parent / "fixtures/lrt_release_vanilla/model"
    assert (
        convert(
            "--from", "nanochat", "--to", "orbax", release, tmp_path / "ckpt", "--verify", "--seq-len", 12
        )
        == 0
    )
    assert (
        convert(
            "--from",
            "orbax",
            "--to",
            "nanochat",
            tmp_path / "ckpt",
            tmp_path / "back",
            "--verify",
            "--seq-len",
            12,
        )
        == 0
    )
    too_long = ("--from", "orbax", "--to", "nanochat", tmp_path / "ckpt", tmp_path / "long", "--verify")
    assert convert(*too_long) == 2  # 32 tokens > the model's 16: refused before anything is written
    assert not (tmp_path / "long").exists()
    for name in ("ckpt.verify.json", "back.verify.json"):
        report = json.loads((tmp_path / name).read_text())
        check_verify(report, 4, f"--verify nanochat {name}")  # the release's vanilla GPT: 4 layers
        assert report["torch_format"] == "nanochat"
    theirs, ours = (torch_state(folder / "model_000000.pt") for folder in (release, tmp_path / "back"))
    assert sorted(theirs) == sorted(ours)
    for key, value in theirs.items():
        rows = 100 if value.shape[0] == 128 else value.shape[0]  # the vocabulary tables' real rows
        assert torch.equal(ours[key][:rows], value[:rows]) and not ours[key][rows:].any(), key


def test_an_interleaved_lrt_checkpoint_is_refused_before_anything_is_written(tmp_path, capsys):
    release = Path(__file__).parent / "fixtures/lrt_release_interleaved/model"
    assert convert("--from", "nanochat", "--to", "orbax", release, tmp_path / "ckpt") == 2
    assert "interleaved (recurrent) GPT" in capsys.readouterr().err and not (tmp_path / "ckpt").exists()
