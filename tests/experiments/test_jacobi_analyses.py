"""experiments/jacobi_vs_exact.py and experiments/gradient_fidelity.py (the paper's Table 6 and Fig. 7):
--help and one-line errors, then their core functions on one tiny S5 model (32 wide, rows of at most
T = 9 tokens), trained 2 steps per row once for the module: the 2 x 2 table is finite and, with D = T,
the Jacobi eval equals the exact one; the gradient anchor compares as identical to itself, D = B >= T
reproduces it, a one-pass forward does not; results.json / .md / .png are written."""

import json
import math
import re

import pytest

from t2mlr_jax.config.edit import config_module, set_path
from t2mlr_jax.studies import analysis_common, gradient_fidelity, jacobi_vs_exact
from tests.experiments import ROOT
from tests.tolerance import assert_within, fp32_bound

pytestmark = pytest.mark.xdist_group("jacobi_analyses")  # one worker trains the shared rows once
T = 9  # the longest row (S5 with at most 2 actions)
TINY = {
    "model.hidden_size": 32,
    "model.num_heads": 2,
    "model.num_kv_heads": 2,
    "model.head_dim": 16,
    "model.mlp_dim": 64,
    "model.recurrence.d_forward": T,  # Jacobi is exact at positions < D: here every position
    "model.recurrence.d_backward": 2,
    "data.options.max_actions": 2,
    "data.eval_options.max_actions": 2,
    "data.seq_len": T,
    "eval.window": T,
    "train.steps": 2,
    "train.batch_size": 8,  # the tests' 8 CPU devices split the batch
    "train.log_every": 1,
    "train.checkpoint_every": 2,
    "eval.num_examples": 16,
    "eval.batch_size": 8,
}


def tiny_config():
    config = config_module(ROOT / "configs" / "s5_retrieval_t2mlr.py").get_config("cpu")
    for path, value in TINY.items():
        set_path(config, path, value)
    return config


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    """Both rows trained and evaluated once: (out, config, meta, rows)."""
    out = tmp_path_factory.mktemp("jacobi_vs_exact")
    config = tiny_config()
    rows = jacobi_vs_exact.compare(config, out)
    meta = {
        "preset": "tiny",
        "command": "test",
        "device": "cpu",
        "jax": "-",
        "seed": 0,
        "d_forward": T,
        "d_backward": 2,
        "longest_eval_row": jacobi_vs_exact.longest_eval_row(config),
        "wall_seconds": 0.0,
    }
    return out, config, meta, rows


@pytest.mark.parametrize("script", [jacobi_vs_exact, gradient_fidelity])
def test_help_lists_the_flags(script, capsys):
    with pytest.raises(SystemExit) as exit_info:
        script.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--preset", "--out", "--d_forward", "--d_backward", "--steps", "--eval_path"):
        assert flag in out


@pytest.mark.parametrize(
    "script, argv, message",
    [
        (jacobi_vs_exact, ["--d_forward=4", "--d_backward=8"], "need 1 <= B <= D"),
        (jacobi_vs_exact, ["--d_backward=0"], "need 1 <= B <= D"),
        (jacobi_vs_exact, ["--preset=big"], "argument --preset: invalid choice"),
        (jacobi_vs_exact, ["--preset=paper"], "--preset=paper needs --train_path and --eval_path"),
        (gradient_fidelity, ["--preset=paper"], "--preset=paper needs --checkpoint and --eval_path"),
        (gradient_fidelity, ["--reference=4,8"], "--reference must be D,B with B <= D"),
        (gradient_fidelity, ["--d_forward=2,0"], "argument --d_forward: expected integers >= 1"),
        (gradient_fidelity, ["--d_forward=1", "--d_backward=2"], "no (D, B) cell with B <= D"),
        (gradient_fidelity, ["--checkpoint=/no/such/run"], "init_from '/no/such/run' does not exist"),
    ],
)
def test_bad_arguments_fail_in_one_line(script, argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        script.main([*argv, f"--out={tmp_path / 'out'}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # two trainer runs (a Jacobi and an exact train step compiled) and their evaluations
def test_the_two_by_two_table(compared):
    out, _, meta, rows = compared
    assert list(rows) == ["exact", "jacobi"]
    for mode, row in rows.items():
        assert row["steps"] == 2 and row["seconds_per_step"] > 0, mode
        for eval_mode in ("exact", "jacobi"):
            assert math.isfinite(row["eval"][eval_mode]["loss"]), (mode, eval_mode)
        # T <= D: the Jacobi forward is the exact recurrence, to round-off. A mean cross-entropy moves by at
        # most 2 max |Δ logit| (log-softmax is 1-Lipschitz in the max norm): tests/tolerance.py's depth rule
        # over T tokens x 4 layers, on logits of a model 2 steps from its init (|logit| < 10), bounds it.
        difference = abs(row["eval"]["jacobi"]["loss"] - row["eval"]["exact"]["loss"])
        assert_within(difference, 2 * fp32_bound(T * 4, 10), f"{mode}: eval loss")
    assert meta["longest_eval_row"] == T
    markdown = jacobi_vs_exact.write_results(out, meta, rows)
    assert "exact train (truncated BPTT, B=2)" in markdown and f"Jacobi train (D={T}, B=2)" in markdown
    saved = json.loads((out / "results.json").read_text())
    assert set(saved) == {"meta", "rows"} and set(saved["rows"]) == {"exact", "jacobi"}
    assert set(saved["rows"]["jacobi"]["eval"]) == {"exact", "jacobi"}
    assert (out / "results.md").read_text() == markdown and (out / "results.png").stat().st_size > 0
    # A rerun trains and evaluates nothing: the summaries and eval_<mode>.json files are read back.
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("*/eval_*.json")}
    again = jacobi_vs_exact.compare(compared[1], out)
    assert {m: r["eval"] for m, r in again.items()} == {m: r["eval"] for m, r in rows.items()}
    assert {p: p.stat().st_mtime_ns for p in out.glob("*/eval_*.json")} == stamps


@pytest.mark.slow  # three Jacobi gradients compiled (and the shared rows, when run alone)
def test_gradient_fidelity_on_the_jacobi_checkpoint(compared, tmp_path):
    out, config, _, rows = compared
    params = analysis_common.load_params(config, out / "jacobi")()
    batches = gradient_fidelity.eval_batches(config, 1)
    cells = gradient_fidelity.grid((1, T), (1, T), (16, 16))
    assert cells == [(16, 16), (1, 1), (T, 1), (T, T)]
    result = gradient_fidelity.measure(config, params, batches, cells)
    assert list(result["groups"]) == ["mixer", "before", "window", "after", "embed_head", "all"]
    sizes = {
        g: int(re.search(r"([\d,]+) parameters?$", about)[1].replace(",", ""))
        for g, about in result["groups"].items()
    }
    assert sizes["all"] == sum(n for g, n in sizes.items() if g != "all") == rows["jacobi"]["params"]
    by_cell = {(c["d_forward"], c["d_backward"]): c["groups"] for c in result["cells"]}
    for name in result["groups"]:
        anchor = by_cell[16, 16][name]
        assert anchor["cosine"] == pytest.approx(1.0, abs=1e-12) and anchor["rel_l2"] == 0.0, name
        exact = by_cell[T, T][name]  # D = B >= T: the same function of the parameters as the anchor
        assert exact["cosine"] == pytest.approx(1.0, abs=1e-5), name
        assert exact["norm_ratio"] == pytest.approx(1.0, abs=1e-4), name
    assert by_cell[1, 1]["all"]["rel_l2"] > 0.01  # one unfused pass: not the recurrence's gradient
    assert by_cell[T, 1]["all"]["rel_l2"] > 1e-4  # exact values, but the gradient truncated at B = 1
    meta = {
        "preset": "tiny",
        "command": "test",
        "device": "cpu",
        "jax": "-",
        "checkpoint": str(out / "jacobi"),
        "batches": 1,
        "rows_per_batch": 8,
        "longest_row": T,
        "wall_seconds": 0.0,
    }
    markdown = gradient_fidelity.write_results(tmp_path, meta, result)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert set(saved) == {"meta", "reference", "groups", "cells"} and saved["reference"] == [16, 16]
    assert set(saved["cells"][0]) == {"d_forward", "d_backward", "groups", "seconds"}
    assert set(saved["cells"][0]["groups"]["all"]) == {"cosine", "rel_l2", "norm_ratio"}
    assert "| 16 | 16 | 1.0000 / 0.0000 |" in markdown
    assert (tmp_path / "results.png").stat().st_size > 0
