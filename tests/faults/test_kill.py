"""Exact resumption: a run killed with SIGKILL (also while an async save is in flight) and restarted from its
workdir ends with a state (parameters, optimizer, RNG) bitwise equal to an uninterrupted run's, and with the
same metrics log (no step logged twice, the logging window that a kill cut in two averaged as if it had not
been); an LRT run (MoE routing biases updated without gradients, pass counts sampled per step, Muon)
preempted and resumed does too."""

import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from t2mlr_jax.train.trainer import Run, restore_state, train
from tests.faults.tiny_run import STEPS, assert_same_state, final_state, records, signalling_source
from tests.train.tiny_task import tiny_lrt_config, tiny_source

WORKER = os.path.join(os.path.dirname(__file__), "kill_worker.py")


def _worker(workdir, at=0, signame="SIGKILL"):
    return subprocess.run(
        [sys.executable, WORKER, str(workdir), str(at), signame],
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


def _lrt_config():
    """P sampled from {1, 2}: each distinct P compiles its own step, and P = 3, 4 would only be slower."""
    config = tiny_lrt_config(steps=STEPS, checkpoint_every=2)
    config.lrt.passes, config.lrt.pass_probs = (1, 2), (0.5, 0.5)
    return config


def _lrt_state(workdir, source=None):
    summary = train(Run(_lrt_config(), workdir, source or tiny_source(), "lrt"))
    state, step = restore_state(Run(_lrt_config(), workdir, tiny_source(), "lrt"))
    return summary, state, step


@pytest.mark.slow
def test_a_preempted_lrt_resumes_bitwise(tmp_path):
    _, straight, _ = _lrt_state(tmp_path / "straight")

    summary, _, step = _lrt_state(tmp_path / "resumed", signalling_source(5, signal.SIGTERM))
    assert summary == {"stopped_by": "SIGTERM", "step": 5} and step == 5
    _, resumed, step = _lrt_state(tmp_path / "resumed")
    assert step == STEPS
    assert_same_state(straight, resumed)
    assert np.abs(np.asarray(resumed.model_state["mlp"]["router_bias"])).max() > 0  # the biases moved
