"""The fault cases share two runs of the tiny T²MLR config, trained once per test session: one straight
through (the reference every recovery must reproduce bitwise) and one stopped by a SIGTERM after step 7
(checkpoints 2 to 7 on disk, a logging window open since step 6). A case copies the stopped run and
damages the copy."""

import shutil
import signal

import pytest
from absl import flags

from tests.faults.tiny_run import final_state, records, signalling_source, train_tiny

flags.FLAGS.mark_as_parsed()  # grain reads absl flags

STOP_AFTER = 7


@pytest.fixture(scope="session")
def straight(tmp_path_factory):
    """(final state, metrics records) of the uninterrupted run."""
    workdir = tmp_path_factory.mktemp("straight")
    train_tiny(workdir)
    return final_state(workdir), records(workdir)


@pytest.fixture(scope="session")
def _stopped(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("stopped")
    summary = train_tiny(workdir, source=signalling_source(STOP_AFTER, signal.SIGTERM))
    assert summary == {"stopped_by": "SIGTERM", "step": STOP_AFTER}
    return workdir


@pytest.fixture
def stopped(_stopped, tmp_path):
    """A fresh copy of the stopped run's workdir."""
    return shutil.copytree(_stopped, tmp_path / "run")
