"""Five kinds of damaged checkpoint are each set aside (moved to corrupt_checkpoints/, never deleted);
training falls back past them to the last good one, saves their steps again, and ends bitwise where the
uninterrupted run ends, with the same metrics log. When every checkpoint is corrupt, the run refuses to
start over unless asked to (and then moves them and the run's metrics aside); only some corrupt, the run
resumes from the newest good one. Anything in checkpoints/ this trainer did not write is refused,
untouched."""

import shutil
import signal

import pytest

from t2mlr_jax.storage.checkpoint import AllCorruptError
from t2mlr_jax.storage.workdir import UnexpectedCheckpointError
from tests.faults.tiny_run import (
    assert_same_state,
    config,
    final_state,
    records,
    run,
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
    aside = stopped / "corrupt_checkpoints"
    assert sorted(p.name for p in aside.iterdir()) == [*(str(s) for s in range(2, 8)), "metrics.jsonl"]
    assert (aside / "metrics.jsonl").read_bytes() == before[stopped / "metrics.jsonl"]  # history moved too
    assert_same_state(straight[0], final_state(stopped))  # from step 0, as the straight run
    assert records(stopped) == straight[1]


@pytest.mark.parametrize(
    "corrupt, resumed", [((7,), 6), ((2,), 7), ((7, 5, 3), 6)], ids=["newest", "oldest", "every second"]
)
def test_some_checkpoints_corrupt_resume_from_the_newest_good_one(stopped, corrupt, resumed):
    """Which checkpoint a session resumes from and what it sets aside (training on from there is the
    fallback test's, bitwise)."""
    for step in corrupt:
        _flip(stopped / "checkpoints" / str(step))
    tiny = run(stopped)
    checkpointer = tiny.checkpointer()
    try:
        _, restored = tiny.restore_or_init(checkpointer)
    finally:
        checkpointer.close()
    assert restored.step == resumed
    set_aside = [7] if 7 in corrupt else []  # only those newer than the one restored: older ones age out
    assert [int(p.name) for p in (stopped / "corrupt_checkpoints").glob("*")] == set_aside


def _files_for_steps(checkpoints):  # every step folder replaced by a file of its name
    for folder in list(checkpoints.iterdir()):
        shutil.rmtree(folder)
        folder.write_text("not a checkpoint")


STRAYS = {
    "step folders replaced by files": _files_for_steps,
    "a file of ours": lambda checkpoints: (checkpoints / "notes.txt").write_text("mine"),
    "a folder of another name": lambda checkpoints: (checkpoints / "7-old").mkdir(),
    "checkpoints a file": lambda checkpoints: shutil.rmtree(checkpoints) or checkpoints.write_text("x"),
}


@pytest.mark.parametrize("stray", list(STRAYS))
def test_what_is_not_a_checkpoint_is_refused_and_nothing_changes(stopped, stray):
    """A checkpoints folder holding what this trainer did not write is not "no checkpoint": starting over
    would delete it and overwrite metrics.jsonl. Refused, naming it, before anything is built."""
    STRAYS[stray](stopped / "checkpoints")
    before = {p: p.read_bytes() for p in stopped.rglob("*") if p.is_file()}
    refused = r"^/.* is a (file|folder) this trainer did not write"
    with pytest.raises(UnexpectedCheckpointError, match=refused):
        run(stopped)
    assert {p: p.read_bytes() for p in stopped.rglob("*") if p.is_file()} == before
