"""A diverging run (learning rate 1e30) never applies or saves a non-finite step: it stops naming the step
(exit status 1 from main.py, one error line), or, with train.nan_policy=skip, logs and skips such steps up
to train.nan_skip_limit."""

import json

import jax
import numpy as np
import pytest

from t2mlr_jax.storage.workdir import read_sessions
from t2mlr_jax.train.stopping import NonFiniteError
from t2mlr_jax.train.trainer import restore_state
from tests.faults.tiny_run import config, records, run, train_tiny
from tests.test_main import S5, TINY, main

pytestmark = [pytest.mark.xdist_group("faults"), pytest.mark.slow]


def _diverging(**train):
    cfg = config(**train)
    cfg.optimizer.lr = 1e30  # the third step's gradient overflows
    return cfg


def _finite(state) -> bool:
    return all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(state))


def test_a_non_finite_step_stops_the_run_and_every_checkpoint_stays_finite(tmp_path):
    stopped = r"^step 3: non-finite gradient norm .* checkpoint \(step 2\)"
    with pytest.raises(NonFiniteError, match=stopped):
        train_tiny(tmp_path, _diverging())
    state, step = restore_state(run(tmp_path, _diverging()))
    assert step == 2 and _finite(state)
    assert not (tmp_path / "summary.json").exists()
    last = records(tmp_path)[-1]
    assert last["split"] == "nonfinite" and last["step"] == 3 and last["grad_norm"] == "nan"


def test_the_skip_policy_skips_and_logs_up_to_its_limit(tmp_path):
    summary = train_tiny(tmp_path / "skip", _diverging(nan_policy="skip", nan_skip_limit=10))
    skipped = [r["step"] for r in records(tmp_path / "skip") if r["split"] == "nonfinite"]
    assert skipped == list(range(3, 10))  # every step after the first two diverged, none applied
    state, step = restore_state(run(tmp_path / "skip", _diverging(nan_policy="skip")))
    assert step == 9 and _finite(state) and summary["steps"] == 9
    json.loads((tmp_path / "skip" / "summary.json").read_text())  # strict JSON, no bare NaN

    with pytest.raises(NonFiniteError, match=r"^step 5: .*3 > train.nan_skip_limit") as stopped:
        train_tiny(tmp_path / "limit", _diverging(nan_policy="skip", nan_skip_limit=2))
    assert "nan_policy=skip" not in str(stopped.value)  # already set: not suggested again
    last = read_sessions(tmp_path / "limit")[-1]
    assert (last["event"], last["step"], last["how"]) == ("end", 5, "nonfinite")
    out = main(
        f"--config={S5}:cpu",
        *TINY,
        "--config.optimizer.lr=1e30",
        "--config.train.steps=8",
        "--config.model.recurrence.d_forward=2",  # a smaller step to compile
        "--config.model.recurrence.d_backward=1",
        "--config.t2mlr.d_forward_values=",  # D fixed: one train step to compile, not one per sampled D
        f"--workdir={tmp_path}",
    )
    assert out.returncode == 1, out.stderr[-2000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "non-finite" in errors[0] and "Traceback" not in out.stderr
