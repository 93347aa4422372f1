"""t2mlr_jax/train/local_workers.py: shards of a list, and run_workers on stand-in worker commands."""

import os
import signal
import sys
import threading
import time

import pytest

from t2mlr_jax.train.local_workers import WorkerFailed, parse_shard, run_workers, shard_of


def test_shards_partition_the_runs_and_bad_shards_are_one_line():
    runs = [f"run{i}" for i in range(7)]
    shards = [shard_of(runs, (i, 3)) for i in range(3)]
    assert shards[0] == ["run0", "run3", "run6"] and sorted(sum(shards, [])) == runs
    assert shard_of(runs, None) == runs
    assert parse_shard("1/2") == (1, 2)
    for bad, problem in (("2/2", "I must be in 0..N-1"), ("1", "expected I/N"), ("a/b", "expected I/N")):
        with pytest.raises(ValueError, match=problem):
            parse_shard(bad)


def _python(code: str, *args) -> list[str]:
    return [sys.executable, "-c", code, *map(str, args)]


def test_workers_run_side_by_side_stop_on_a_signal_and_fail_in_one_line(tmp_path):
    """run_workers, on stand-in worker commands: every worker's (row, seed) done; a signal passed on to
    the workers, which stop (a rerun resumes); a failing worker stops the others and is one error line."""
    units = [tmp_path / f"unit{i}" for i in range(2)]
    finish = (
        "import pathlib, sys; p = pathlib.Path(sys.argv[1]); p.mkdir(); (p / 'summary.json').write_text('{}')"
    )
    assert run_workers([_python(finish, u) for u in units], tmp_path, units)
    assert all((u / "summary.json").exists() for u in units)

    slow = _python("import time; time.sleep(60)")
    started = time.time()
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
    assert not run_workers([slow, slow], tmp_path, units)  # stopped, not failed
    assert time.time() - started < 30

    boom = _python("import sys; print('error: step 3: loss is nan', end='\\rbar 10%'); sys.exit(3)")
    with pytest.raises(
        WorkerFailed, match=r"^worker1 exited with status 3: step 3: loss is nan \(all of it: "
    ):
        run_workers([slow, boom], tmp_path, units)
    assert time.time() - started < 60  # the slow worker was stopped, not waited for
    assert (tmp_path / "worker1.log").read_bytes() == b"error: step 3: loss is nan\rbar 10%"
