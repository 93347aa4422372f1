"""Exact resumption: runs killed (SIGKILL, also while an async save is in flight) or preempted (SIGTERM) at
several steps and restarted from their workdir end with a state (parameters, optimizer, non-gradient model
state) bitwise equal to an uninterrupted run's, and with the same metrics log (no step logged twice, the
logging window that a kill cut in two averaged as if it had not been)."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from t2mlr_jax.train.trainer import Run, restore_state
from tests.faults.kill_worker import CONFIGS
from tests.faults.tiny_run import assert_same_state, records
from tests.train.tiny_task import tiny_source

WORKER = os.path.join(os.path.dirname(__file__), "kill_worker.py")
# t2mlr: a crash right after the async save of step 2 began (resumed inside a logging window), then one
# after a resume (SIGTERM preemptions: the `stopped` run every other fault case starts from). lrt (MoE
# biases, sampled pass counts, Muon): one crash mid-run.
INTERRUPTIONS = {
    "t2mlr": ((3, "SIGKILL"), (8, "SIGKILL")),
    "lrt": ((5, "SIGKILL"),),
}


def _run(arch, workdir, at=0, signame="SIGKILL"):
    return subprocess.run(
        [sys.executable, WORKER, arch, str(workdir), str(at), signame],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )


def _final_state(arch, workdir):
    state, step = restore_state(Run(CONFIGS[arch](), workdir, tiny_source(), arch))
    assert step == 9
    return state


def _interrupted_then_finished(arch, workdir):
    for at, signame in INTERRUPTIONS[arch]:
        out = _run(arch, workdir, at, signame)
        if signame == "SIGKILL":
            assert out.returncode == -9, out.stderr[-3000:]
        else:
            assert out.returncode == 0 and "STOPPED" in out.stdout, out.stderr[-3000:]
    final = _run(arch, workdir)
    assert final.returncode == 0 and "DONE" in final.stdout, final.stderr[-3000:]


@pytest.mark.xdist_group("faults")
def test_killed_and_preempted_t2mlr_resumes_bitwise_with_the_same_log(tmp_path, straight):
    _interrupted_then_finished("t2mlr", tmp_path)
    assert_same_state(straight[0], _final_state("t2mlr", tmp_path))
    assert records(tmp_path) == straight[1]


def test_a_killed_lrt_resumes_bitwise(tmp_path):
    straight = _run("lrt", tmp_path / "straight")
    assert straight.returncode == 0 and "DONE" in straight.stdout, straight.stderr[-3000:]
    _interrupted_then_finished("lrt", tmp_path / "resumed")
    a, b = _final_state("lrt", tmp_path / "straight"), _final_state("lrt", tmp_path / "resumed")
    assert_same_state(a, b)
    assert np.abs(np.asarray(b.model_state["mlp"]["router_bias"])).max() > 0  # the routing biases moved
    assert jax.tree.leaves(b.opt_state)
