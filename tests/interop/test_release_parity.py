"""tools/release_parity.py without the releases: --help, bad input refused (one error line, exit 2,
nothing written), and its comparison on the committed LRT-release fixture (made by the release's own
code): every figure passes, and a perturbed release logit or gradient fails. For the T²MLR release
(--release t2mlr), on its committed fixture (tests/interop/fixtures/release_default, made by its own
code): a perturbed training-forward logit fails and shows in the table, and the export of the imported
model is its state dict bitwise, which one perturbed weight breaks."""

import runpy
import sys
from pathlib import Path

import numpy as np
import pytest

from t2mlr_jax.interop import load_pretrained
from t2mlr_jax.studies.parity import (
    compare,
    compare_states,
    our_outputs,
    path_layers,
    release_model_config,
    release_state,
    save_release,
)
from tests.in_process import run_tool
from tests.interop.helpers import check_figures, exported_nanochat, numpy_state

TOOL = Path(__file__).parents[2] / "tools" / "release_parity.py"
FIXTURE = Path(__file__).parent / "fixtures/lrt_release_vanilla"
T2MLR_FIXTURE = Path(__file__).parent / "fixtures/release_default"
# release_parity's tiny T²MLR size as its driver writes it (the same model as release_default's):
# python -m experiments.make_release_fixture --size tiny --out tests/interop/fixtures/t2mlr_release_tiny
T2MLR_TINY = Path(__file__).parent / "fixtures/t2mlr_release_tiny"
PREFILL = 4  # the fixture's cached decode


@pytest.fixture(scope="module")
def fixture_outputs():
    """(release.npz, our outputs on its tokens, cfg, params, each output's path depth) of the committed
    fixture."""
    release = dict(np.load(FIXTURE / "release.npz"))
    cfg, params = load_pretrained(FIXTURE / "model")
    layers = path_layers(cfg, params, release["tokens"].shape[1])
    return release, our_outputs(cfg, params, release["tokens"], PREFILL), cfg, params, layers


def fake_checkout(path: Path, *, lrt: bool = True) -> Path:
    """The files by which the tool recognises a checkout (nothing that runs)."""
    (path / "nanochat").mkdir(parents=True)
    (path / "nanochat/gpt.py").write_text("use_interleaved = False\n" if lrt else "smear_gate = None\n")
    for name in ("checkpoint_manager.py", "engine.py"):
        (path / "nanochat" / name).write_text("")
    return path


def fake_t2mlr_checkout(path: Path) -> Path:
    """The file by which the T²MLR release's driver recognises a checkout (nothing that runs)."""
    (path / "src/t2mlr_wrapper").mkdir(parents=True)
    (path / "src/t2mlr_wrapper/t2mlr_wrapper.py").write_text("")
    return path


def test_help(capsys):
    assert run_tool(TOOL, "--help") == 0
    text = capsys.readouterr().out
    names = ("--release_src", "--release_python", "--sizes", "d12", "lrt", "parity.json", "u = 2^-24")
    for name in (*names, "t2mlr", "smollm135m", "princeton-pli/T2MLR", "transformers 4.56/4.57"):
        assert name in text


@pytest.mark.parametrize(
    "case, message",
    [
        ("no checkout", "no such directory"),
        ("not the release", "is not a checkout of OoDBag/Latent_recurrent_transformer"),
        ("karpathy's nanochat", "has no use_interleaved"),
        (
            "the LRT fork as nanochat",
            "not a checkout of karpathy/nanochat (nanochat/gpt.py has no smear_gate",
        ),
        ("a size nanochat lacks", "unknown size tiny_interleaved (--release nanochat has tiny, d12)"),
        ("python not executable", "is not an executable"),
        ("python cannot run it", "cannot run the release"),
        ("unknown size", "unknown size d99"),
        ("unknown release", "--release nosuch: unknown"),
    ],
)
def test_bad_input_is_one_error_line_and_nothing_written(tmp_path, capsys, case, message):
    src, python, extra = tmp_path / "lrt", sys.executable, []
    if case == "not the release":
        src.mkdir()
    elif case in ("karpathy's nanochat", "a size nanochat lacks"):
        fake_checkout(src, lrt=False)
    elif case != "no checkout":
        fake_checkout(src)
    if case == "python not executable":
        python = str(tmp_path / "python")
        Path(python).write_text("")
    elif case == "python cannot run it":
        python = "/bin/false"
    elif case == "unknown size":
        extra = ["--sizes", "tiny,d99"]
    elif case == "unknown release":
        extra = ["--release", "nosuch"]
    elif case == "the LRT fork as nanochat":
        extra = ["--release", "nanochat"]
    elif case == "a size nanochat lacks":
        extra = ["--release", "nanochat", "--sizes", "tiny_interleaved"]
    refused(capsys, tmp_path / "out", message, "--release_src", src, "--release_python", python, *extra)


def refused(capsys, out: Path, message: str, *argv) -> None:
    """The tool, writing to `out`, exits 2 with one error line holding `message`, and writes nothing."""
    assert run_tool(TOOL, *argv, "--out", out) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert not out.exists()


@pytest.mark.parametrize(
    "case, message",
    [
        ("not the release", "is not a checkout of princeton-pli/T2MLR"),
        ("python cannot run it", "cannot run the release"),
        ("unknown size", "unknown size d12 (--release t2mlr has tiny, smollm135m)"),
    ],
)
def test_t2mlr_bad_input_is_one_error_line_and_nothing_written(tmp_path, capsys, case, message):
    # the LRT release is not the T²MLR one
    src = (
        fake_checkout(tmp_path / "lrt") if case == "not the release" else fake_t2mlr_checkout(tmp_path / "t2")
    )
    sizes = "tiny,d12" if case == "unknown size" else "tiny"
    argv = ["--release", "t2mlr", "--release_src", src, "--release_python", "/bin/false", "--sizes", sizes]
    refused(capsys, tmp_path / "out", message, *argv)


def test_a_non_empty_out_is_refused(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out/notes.txt").write_text("mine")
    argv = ["--release_src", fake_checkout(tmp_path / "lrt"), "--out", tmp_path / "out"]
    assert run_tool(TOOL, *argv) == 2
    assert "is not empty: pass --overwrite" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["notes.txt"]


@pytest.mark.numerics
def test_the_fixture_passes_every_check(fixture_outputs):
    """Every figure within the bound derived from its path's depth (4 layers: 10 blocks), recorded."""
    release, ours, _, _, layers = fixture_outputs
    assert layers == {"logits": 4, "decode": 4, "train": 4}
    figures = compare(ours, release, layers)
    check_figures(figures, "lrt_release_vanilla")
    assert figures["logits"]["tolerance"] == 4 * 10 * 2.0**-24
    assert 0 < figures["gradients"]["max_relative_diff"] <= figures["gradients"]["tolerance"]
    assert figures["gradients"]["keys"] == 32 and not figures["gradients"]["zero_keys"]
    assert figures["decode"]["passed"] and figures["loss"]["passed"]


@pytest.mark.numerics
@pytest.mark.parametrize("part", ["logits", "grad:transformer.h.2.mlp.c_fc.weight"])
def test_a_perturbed_release_output_fails(fixture_outputs, part):
    """A release output moved by 1e-3 of its largest value fails: 400x the logits' bound (2.4e-6 of the
    largest), 200x the gradients' (4.8e-6 of each key's)."""
    release, ours, _, _, layers = fixture_outputs
    perturbed = {**release, part: release[part] + 1e-3 * np.abs(release[part]).max()}
    figures = compare(ours, perturbed, layers)
    section = "logits" if part == "logits" else "gradients"
    assert not figures[section]["passed"] and not figures["passed"]
    others = {"logits", "loss", "gradients", "decode"} - {section}
    assert all(figures[name]["passed"] for name in others)
    if section == "gradients":
        assert figures["gradients"]["worst_key"] == part.removeprefix("grad:")


def test_the_table_shows_a_failure(fixture_outputs, tmp_path):
    """The table row of a size: its figures, the export's round trip, and FAIL where a check fails."""
    release, ours, cfg, params, layers = fixture_outputs
    tool = runpy.run_path(str(TOOL))
    written, _ = exported_nanochat(cfg, params, tmp_path / "export")
    state = compare_states(cfg.vocab_size, numpy_state(FIXTURE / "model/model_000000.pt"), written)
    assert state["bitwise"] and state["padded_rows_zero"] and state["padded_rows"] == 28
    figures = compare(ours, {**release, "logits": release["logits"] + 1e-3}, layers)
    trip = {"state": state, "logits_bitwise_equal": True, "passed": True}
    size = {"label": "tiny", "params": 204_928, "round_trip": trip, **figures}
    table = tool["markdown"]({"release": "lrt", "sizes": {"tiny": size}})
    row = table.strip().splitlines()[-1]
    assert row.startswith("| lrt | tiny | 204.9K | 1.0") and "(FAIL)" in row and row.endswith("| NO |")
    assert "state yes, padded rows 28 x 4 tables 0 in ours; release logits on export yes" in row


@pytest.mark.slow
def test_t2mlr_python_on_other_transformers_is_refused(tmp_path, capsys):
    """This Python's transformers (5.x) is not one the release runs on: refused by the probe."""
    argv = ["--release", "t2mlr", "--release_src", fake_t2mlr_checkout(tmp_path / "t2mlr")]
    refused(capsys, tmp_path / "out", "the release needs transformers 4.56/4.57", *argv)


@pytest.fixture(scope="module")
def t2mlr_release():
    """The T²MLR fixture's release outputs in parity.py's layout: its exact (eval) logits, also its
    decode (its decode loop reproduces them bitwise), and its Jacobi (train) logits at the saved D."""
    saved = np.load(T2MLR_FIXTURE / "release.npz")
    return {"tokens": saved["tokens"], "logits": saved["exact"], "train_logits:0": saved["jacobi_d1"]}


# its paths: 4 layers, the window [1, 2], 12 tokens, D = 1: exact 4 + 11 x 2, Jacobi 4 + 1 x 2
T2MLR_LAYERS = {"logits": 26, "decode": 26, "train": 6}


def t2mlr_size(release: dict, ours: dict, state: dict) -> dict:
    """A table size of ours against the release's (their decode: their exact logits)."""
    theirs = {**release, "decode": release["logits"]}
    figures = compare({**ours, "decode": ours["logits"]}, theirs, T2MLR_LAYERS)
    trip = {"state": state, "logits_bitwise_equal": True, "passed": state["bitwise"]}
    figures["passed"] = figures["passed"] and trip["passed"]
    return {"label": "tiny", "params": 39_296, "round_trip": trip, **figures}


def test_t2mlr_export_round_trip_and_a_perturbed_weight(tmp_path):
    cfg, params = load_pretrained(T2MLR_FIXTURE / "model")
    assert path_layers(cfg, params, 12) == T2MLR_LAYERS
    assert release_model_config(T2MLR_FIXTURE / "model")["model_type"] == "t2mlr"
    save_release(cfg, params, tmp_path / "export")  # the authors' layout, as the model is T²MLR
    theirs = release_state(T2MLR_FIXTURE / "model")
    state = compare_states(cfg.vocab_size, theirs, release_state(tmp_path / "export"))
    assert state["bitwise"] and state["keys"] == 45 and not state["padded_tables"], state
    key = "t2mlr_model.model.layers.1.t2mlr_mixing_module.recurrent_gate_proj.weight"
    perturbed = {**theirs, key: theirs[key] + 1e-6}
    state = compare_states(cfg.vocab_size, perturbed, release_state(tmp_path / "export"))
    assert not state["bitwise"] and state["differing"] == [key]


def test_t2mlr_table_shows_a_training_forward_failure(t2mlr_release):
    """The T²MLR row: the logits cell holds the training forward's (Jacobi) figures too, and a perturbed
    one fails the size."""
    tool = runpy.run_path(str(TOOL))
    state = {"bitwise": True, "padded_tables": [], "padded_rows": 0, "padded_rows_zero": True}
    size = t2mlr_size(t2mlr_release, t2mlr_release, state)
    assert size["passed"] and size["train_logits"]["max_abs_diff"] == 0
    row = tool["markdown"]({"release": "t2mlr", "sizes": {"tiny": size}}).strip().splitlines()[-1]
    assert (
        row.startswith("| t2mlr | tiny | 39.3K | 0.00e+00 (rel 0.0e+00); train 0.00e+00")
        and "FAIL" not in row
    )
    train = t2mlr_release["train_logits:0"]
    ours = {**t2mlr_release, "train_logits:0": train + 1e-3 * np.abs(train).max()}
    size = t2mlr_size(t2mlr_release, ours, state)
    assert not size["train_logits"]["passed"] and size["logits"]["passed"] and not size["passed"]
    row = tool["markdown"]({"release": "t2mlr", "sizes": {"tiny": size}}).strip().splitlines()[-1]
    assert "; train 4.06e-03 (rel 1.0e-03) (FAIL) |" in row and row.endswith("| NO |")


@pytest.mark.slow
@pytest.mark.numerics
def test_the_t2mlr_release_tiny_size_passes_every_check_and_a_moved_weight_fails():
    """The T²MLR release's own outputs at release_parity's tiny size: exact and Jacobi logits, the loss,
    every gradient and its cached decode against ours, each within its derived bound; one mixer weight
    moved by 1e-3 fails."""
    release = dict(np.load(T2MLR_TINY / "release.npz"))
    cfg, params = load_pretrained(T2MLR_TINY / "model")
    layers = path_layers(cfg, params, release["tokens"].shape[1])
    assert layers == T2MLR_LAYERS
    figures = compare(our_outputs(cfg, params, release["tokens"], PREFILL), release, layers)
    check_figures(figures, "t2mlr_release_tiny")
    assert figures["gradients"]["keys"] == 45 and not figures["gradients"]["missing"]
    assert figures["train_logits"]["passes"] == 1 and figures["decode"]["passed"]
    gate = params["mixer"]["recurrent_gate_proj"]
    moved = {
        **params,
        "mixer": {**params["mixer"], "recurrent_gate_proj": {**gate, "kernel": gate["kernel"] + 1e-3}},
    }
    figures = compare(our_outputs(cfg, moved, release["tokens"], PREFILL), release, layers)
    assert not figures["logits"]["passed"] and not figures["passed"]
    assert figures["logits"]["ratio"] > 10, figures["logits"]  # far past the bound, not at its edge
