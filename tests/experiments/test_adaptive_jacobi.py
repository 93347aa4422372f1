"""experiments/adaptive_jacobi.py: --help and one-line errors, then its tiny preset end to end (a 2-step
Jacobi checkpoint; the plain step, D = 8 and a tolerance that stops after the first detached pass)."""

import json
import math

import pytest

from t2mlr_jax.studies import adaptive_jacobi


def test_help_lists_the_flags(capsys):
    with pytest.raises(SystemExit) as exit_info:
        adaptive_jacobi.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--preset", "--out", "--checkpoint", "--d_forward", "--tolerances", "--max_d", "--repeats"):
        assert flag in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--tolerances=1e-3,0"], "argument --tolerances: expected finite numbers > 0"),
        (["--max_d=8,16"], "--max_d takes one depth"),
        (["--repeats=0"], "--repeats must be >= 1"),
        (["--preset=big"], "argument --preset: invalid choice"),
        (["--checkpoint=/no/such/run"], "init_from '/no/such/run' does not exist"),
    ],
)
def test_bad_arguments_fail_in_one_line(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        adaptive_jacobi.main([*argv, f"--out={tmp_path / 'out'}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_tiny_preset_end_to_end(tmp_path):
    out = tmp_path / "out"
    argv = ["--preset=tiny", f"--out={out}", "--d_forward=8", "--max_d=8", "--tolerances=10", "--batches=1"]
    rows = adaptive_jacobi.main([*argv, "--repeats=1"])
    assert [r["name"] for r in rows] == ["plain transformer", "Jacobi D=8", "adaptive tol=10"]
    plain, fixed, adaptive = rows
    assert adaptive["passes"] == adaptive["passes_per_batch"][0] == 6  # 1 + one detached + B = 4
    assert fixed["passes"] == 8 and plain["passes"] is None
    assert all(math.isfinite(r["loss"]) and r["seconds"] > 0 for r in rows)
    assert plain["ratio"] == 1.0
    saved = json.loads((out / "results.json").read_text())
    assert set(saved) == {"meta", "variants"} and saved["meta"]["d_backward"] == 4
    # tolerance 10: the first detached pass already moves R by less, so the batch is marked converged
    assert adaptive["converged_per_batch"] == [True] and adaptive["final_change_per_batch"][0] < 10
    assert fixed["converged_per_batch"] is None
    assert "| adaptive tol=10 | 8 | 6.00 | 1/1 |" in (out / "results.md").read_text()
    assert (out / "results.png").stat().st_size > 0
