"""Exact resumption: runs killed (SIGKILL) or preempted (SIGTERM) at several steps and restarted from their
workdir end with parameters bitwise equal to an uninterrupted run."""

import os
import subprocess
import sys

import jax
import numpy as np

from t2mlr_jax.train.trainer import Run, restore_state
from tests.train.tiny_task import tiny_config, tiny_source

WORKER = os.path.join(os.path.dirname(__file__), "resume_worker.py")


def _run(workdir, kill_at=0, signame="SIGKILL"):
    return subprocess.run(
        [sys.executable, WORKER, str(workdir), str(kill_at), signame],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )


def _final_params(workdir):
    state, step = restore_state(
        Run(tiny_config("t2mlr", steps=9, checkpoint_every=2), workdir, tiny_source(), "t2mlr")
    )
    assert step == 9
    return state.params


def test_killed_and_preempted_runs_resume_bitwise(tmp_path):
    straight = _run(tmp_path / "straight")
    assert straight.returncode == 0 and "DONE" in straight.stdout, straight.stderr[-3000:]

    resumed = tmp_path / "resumed"
    # Crash mid-run (async save of step 2 may be in flight), again after a resume, then a preemption.
    for kill_at, signame in ((4, "SIGKILL"), (7, "SIGKILL"), (8, "SIGTERM")):
        out = _run(resumed, kill_at, signame)
        if signame == "SIGKILL":
            assert out.returncode == -9, out.stderr[-3000:]
        else:
            assert out.returncode == 0 and "STOPPED" in out.stdout, out.stderr[-3000:]
    final = _run(resumed)
    assert final.returncode == 0 and "DONE" in final.stdout, final.stderr[-3000:]

    a, b = _final_params(tmp_path / "straight"), _final_params(resumed)
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
