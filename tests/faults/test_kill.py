"""Exact resumption: a run killed with SIGKILL (also while an async save is in flight) and restarted from its
workdir ends with a state (parameters, optimizer, RNG) bitwise equal to an uninterrupted run's, and with the
same metrics log (no step logged twice, the logging window that a kill cut in two averaged as if it had not
been), while a second session on its workdir is refused at once (one writer per workdir, the killed
owner's lock stale); an LRT run (MoE routing biases updated without gradients, pass counts sampled per
step, Muon) killed and resumed does too."""

import os
import re
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from t2mlr_jax.storage.workdir import read_sessions
from t2mlr_jax.storage.workdir_lock import WorkdirLockedError
from t2mlr_jax.train.trainer import restore_state
from tests.faults.tiny_run import STEPS, assert_same_state, final_state, records, run, train_tiny

pytestmark = pytest.mark.slow

WORKER = os.path.join(os.path.dirname(__file__), "kill_worker.py")


def _start_worker(workdir, at=0, signame="SIGKILL", arch="t2mlr"):
    return subprocess.Popen(
        [sys.executable, WORKER, str(workdir), str(at), signame, arch],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )


def _worker(workdir, at=0, signame="SIGKILL", arch="t2mlr"):
    proc = _start_worker(workdir, at, signame, arch)
    proc.stdout, proc.stderr = proc.communicate(timeout=300)
    return proc


def _wait_for(marker, proc, timeout=300):
    deadline = time.monotonic() + timeout
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"{marker} never appeared"
        time.sleep(0.1)


@pytest.mark.xdist_group("faults")
def test_a_killed_run_resumes_bitwise_with_the_same_log_and_one_writer(tmp_path, straight):
    # A crash right after the async save of step 2 began: resumed from step 2 or 1, inside a logging window.
    workdir = tmp_path / "run"
    out = _worker(workdir, 3)
    assert out.returncode == -9, out.stderr[-3000:]
    assert (workdir / "train.lock").exists()  # the killed owner's, stale: it must not block the resume
    # The resume, held before step 5, meets a second session on its workdir: refused at once, naming it.
    owner = _start_worker(workdir, 5, "PAUSE")
    _wait_for(tmp_path / "run.paused", owner)
    started = time.monotonic()
    with pytest.raises(
        WorkdirLockedError, match=rf"being trained by pid {owner.pid} on host {socket.gethostname()}"
    ):
        train_tiny(workdir)
    assert time.monotonic() - started < 10
    (tmp_path / "run.go").touch()
    stdout, stderr = owner.communicate(timeout=300)
    assert owner.returncode == 0 and "DONE" in stdout, stderr[-3000:]
    assert re.search(r"^resumed from step [12] ", stdout, re.M)
    assert_same_state(straight[0], final_state(workdir))  # the owner ended as if alone
    assert records(workdir) == straight[1]
    assert not (workdir / "train.lock").exists()
    sessions = [(r["event"], r["step"], r.get("how")) for r in read_sessions(workdir)]
    assert sessions[0] == ("start", 0, None) and sessions[-1] == ("end", STEPS, "finished")
    assert [e for e, _, _ in sessions] == ["start", "start", "end"]  # the killed one never ended


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
