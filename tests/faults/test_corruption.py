"""Five kinds of damaged checkpoint are each set aside (moved to corrupt_checkpoints/, never deleted);
training falls back past them to the last good one, saves their steps again, and ends bitwise where the
uninterrupted run ends, with the same metrics log. When every checkpoint is corrupt, the run refuses to
start over unless asked to."""

import shutil
import signal

import pytest

from t2mlr_jax.storage.checkpoint import AllCorruptError
from tests.faults.tiny_run import (
    assert_same_state,
    config,
    final_state,
    records,
    signalling_source,
    train_tiny,
)

pytestmark = [pytest.mark.xdist_group("faults"), pytest.mark.slow]


def _array_files(step_folder):
    return sorted(
        (f for f in (step_folder / "state").rglob("*") if f.is_file() and f.parent.name == "d"),
        key=lambda f: f.stat().st_size,
    )


def _truncate(step_folder):  # a save cut short: every array file loses its tail
    for f in _array_files(step_folder):
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _flip(step_folder):  # bit rot: one flipped bit in the middle of each array file
    # (In one of them only, the bit may sit where the reader never looks: OCDBT's files also hold index
    # nodes and bytes no key points to, so the state would load intact, which is no corruption.)
    for f in _array_files(step_folder):
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0x10
        f.write_bytes(bytes(data))


def _drop_state(step_folder):  # the arrays are gone
    shutil.rmtree(step_folder / "state")


def _garble_meta(step_folder):  # fingerprints unreadable
    (step_folder / "meta" / "metadata").write_text("{not json")


def _empty(step_folder):  # a folder with the step's name and nothing in it
    shutil.rmtree(step_folder)
    step_folder.mkdir()


DAMAGES = (_truncate, _flip, _drop_state, _garble_meta, _empty)  # one per checkpoint, newest first


def test_corrupt_checkpoints_are_set_aside_saved_again_and_the_run_ends_uninterrupted(stopped, straight):
    # One damage per checkpoint, newest first: 7 truncated, 6 flipped, 5 without arrays, 4 with garbled
    # metadata, 3 empty; only step 2 is good.
    damaged = [str(step) for step in range(7, 2, -1)]
    for step, damage in zip(damaged, DAMAGES):
        damage(stopped / "checkpoints" / step)
    # Resumed from step 2 and preempted after 7 again: orbax would skip every save at or below a bad step
    # still on disk; set aside, each of them is saved anew.
    summary = train_tiny(stopped, source=signalling_source(7, signal.SIGTERM))
    assert summary == {"stopped_by": "SIGTERM", "step": 7}
    assert sorted(p.name for p in (stopped / "corrupt_checkpoints").iterdir()) == sorted(damaged)
    assert sorted(int(p.name) for p in (stopped / "checkpoints").iterdir()) == list(range(2, 8))
    train_tiny(stopped)
    assert_same_state(straight[0], final_state(stopped))
    assert records(stopped) == straight[1]  # the logging window open at step 2 restored with it


def test_every_checkpoint_corrupt_is_refused_unless_a_restart_is_asked_for(stopped, straight):
    for step in range(2, 8):
        _truncate(stopped / "checkpoints" / str(step))
    before = {p: p.read_bytes() for p in stopped.rglob("*") if p.is_file()}
    with pytest.raises(
        AllCorruptError, match=r"every checkpoint .* unreadable: step 7 .* step 2 .*restart_if_all_corrupt"
    ):
        train_tiny(stopped)
    assert {
        p: p.read_bytes() for p in stopped.rglob("*") if p.is_file()
    } == before  # nothing moved or written
    restart = config()
    restart.train.restart_if_all_corrupt = True
    train_tiny(stopped, restart)
    assert sorted(p.name for p in (stopped / "corrupt_checkpoints").iterdir()) == [
        str(s) for s in range(2, 8)
    ]
    assert_same_state(straight[0], final_state(stopped))  # from step 0, as the straight run
    assert records(stopped) == straight[1]
