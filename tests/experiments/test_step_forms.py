"""experiments/step_forms.py: a bad argument is one `error:` line (exit 2); the tiny preset end to end
(four train steps compiled, both VJP comparisons) writes both layouts of both models and the two rows."""

import json
import math

import pytest

from t2mlr_jax.studies.benchmarks import step_forms


def test_bad_reps_fail_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        step_forms.main(["--reps=0", f"--out={tmp_path / 'out'}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --reps must be >= 1") and "\n" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_tiny_preset_end_to_end(tmp_path):
    step_forms.main(["--preset=tiny", "--reps=1", f"--out={tmp_path}"])
    saved = json.loads((tmp_path / "results.json").read_text())
    assert set(saved["layouts"]) == {"plain", "t2mlr"}
    for row in saved["layouts"].values():
        assert all(row[layout]["seconds"] > 0 for layout in ("stacked", "per_layer"))
        assert row["per_layer_over_stacked"]["seconds"] > 0
    assert set(saved["vjps"]) == {"rms_norm", "softmax"}
    for row in saved["vjps"].values():
        assert math.isfinite(row["ours_over_autodiff"]) and row["max_rel_error"] <= 1e-5
    assert len(saved["meta"]["command"]) > 0 and (tmp_path / "results.md").exists()
