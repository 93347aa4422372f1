"""Exact resumption: runs killed (SIGKILL) or preempted (SIGTERM) at several steps and restarted from their
workdir end with a state (parameters, optimizer, non-gradient model state) bitwise equal to an
uninterrupted run's."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from t2mlr_jax.train.trainer import Run, restore_state
from tests.train.resume_worker import CONFIGS
from tests.train.tiny_task import tiny_source

WORKER = os.path.join(os.path.dirname(__file__), "resume_worker.py")
# t2mlr: crash mid-run (an async save may be in flight), again after a resume, then a preemption.
# lrt (MoE biases, sampled pass counts, Muon): one crash mid-run.
INTERRUPTIONS = {
    "t2mlr": ((4, "SIGKILL"), (7, "SIGKILL"), (8, "SIGTERM")),
    "lrt": ((5, "SIGKILL"),),
}


def _run(arch, workdir, kill_at=0, signame="SIGKILL"):
    return subprocess.run(
        [sys.executable, WORKER, arch, str(workdir), str(kill_at), signame],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )


def _final_state(arch, workdir):
    state, step = restore_state(Run(CONFIGS[arch](), workdir, tiny_source(), arch))
    assert step == 9
    return state


@pytest.mark.parametrize("arch", sorted(INTERRUPTIONS))
def test_killed_and_preempted_runs_resume_bitwise(tmp_path, arch):
    straight = _run(arch, tmp_path / "straight")
    assert straight.returncode == 0 and "DONE" in straight.stdout, straight.stderr[-3000:]

    resumed = tmp_path / "resumed"
    for kill_at, signame in INTERRUPTIONS[arch]:
        out = _run(arch, resumed, kill_at, signame)
        if signame == "SIGKILL":
            assert out.returncode == -9, out.stderr[-3000:]
        else:
            assert out.returncode == 0 and "STOPPED" in out.stdout, out.stderr[-3000:]
    final = _run(arch, resumed)
    assert final.returncode == 0 and "DONE" in final.stdout, final.stderr[-3000:]

    a, b = _final_state(arch, tmp_path / "straight"), _final_state(arch, resumed)
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    if arch == "lrt":  # the routing biases really moved, and the passes logged were sampled
        assert np.abs(np.asarray(b.model_state["mlp"]["router_bias"])).max() > 0
