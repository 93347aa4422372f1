"""Exact resumption: a run killed with SIGKILL (also while an async save is in flight) and restarted from its
workdir ends with a state (parameters, optimizer, RNG) bitwise equal to an uninterrupted run's, and with the
same metrics log (no step logged twice, the logging window that a kill cut in two averaged as if it had not
been); an LRT run (MoE routing biases updated without gradients, pass counts sampled per step, Muon)
killed and resumed does too."""

import os
import subprocess
import sys

import numpy as np
import pytest

from t2mlr_jax.train.trainer import restore_state
from tests.faults.tiny_run import STEPS, assert_same_state, final_state, records, run

WORKER = os.path.join(os.path.dirname(__file__), "kill_worker.py")


def _worker(workdir, at=0, signame="SIGKILL", arch="t2mlr"):
    return subprocess.run(
        [sys.executable, WORKER, str(workdir), str(at), signame, arch],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )


@pytest.mark.slow  # first: it moves the whole faults group to the front of the queue
@pytest.mark.xdist_group("faults")
def test_a_killed_run_resumes_bitwise_with_the_same_log(tmp_path, straight):
    # A crash right after the async save of step 2 began: resumed from step 2 or 1, inside a logging window.
    out = _worker(tmp_path, 3)
    assert out.returncode == -9, out.stderr[-3000:]
    final = _worker(tmp_path)
    assert final.returncode == 0 and "DONE" in final.stdout, final.stderr[-3000:]
    assert_same_state(straight[0], final_state(tmp_path))
    assert records(tmp_path) == straight[1]


@pytest.mark.slow
def test_a_killed_lrt_resumes_bitwise(tmp_path):
    # All three runs in subprocesses: the first compiles into the suite's cache, the other two read it.
    out = _worker(tmp_path / "straight", arch="lrt")
    assert out.returncode == 0 and "DONE" in out.stdout, out.stderr[-3000:]
    straight, _ = restore_state(run(tmp_path / "straight", arch="lrt"))
    # Killed before step 5 ran, with the save of step 4 possibly in flight: resumed from step 4 or 2.
    out = _worker(tmp_path / "killed", 5, arch="lrt")
    assert out.returncode == -9, out.stderr[-3000:]
    final = _worker(tmp_path / "killed", arch="lrt")
    assert final.returncode == 0 and "DONE" in final.stdout, final.stderr[-3000:]
    resumed, step = restore_state(run(tmp_path / "killed", arch="lrt"))
    assert step == STEPS
    assert_same_state(straight, resumed)
    assert np.abs(np.asarray(resumed.model_state["mlp"]["router_bias"])).max() > 0  # the biases moved
