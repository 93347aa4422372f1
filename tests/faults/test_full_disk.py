"""A full disk, told in one line, with nothing half-written left behind. The tests inject the failure at
the write boundary (an OSError(ENOSPC), or a file system reporting no free space), in the process itself:

- training: a metrics line, a checkpoint refused before it starts (no room for one), and a checkpoint cut
  short midway (its unfinished step folder on disk) each end the session with NoSpaceError naming the path,
  the unfinished save removed, the last good checkpoint intact and the session record closed ("no_space");
  the reruns resume and end bitwise where the uninterrupted run ends, with the same metrics log;
- exports (tools/convert_checkpoint.py) and reports are written whole or not at all: a failure or a kill
  midway leaves the target absent, as it was, or the complete new one.
(A real full tmpfs, run by hand, behaves the same: docs/reliability.md.)"""

import errno
import os
import runpy
import signal
import subprocess
import sys
from collections import namedtuple

import pytest
from transformers import LlamaForCausalLM

from t2mlr_jax.formats import hf
from t2mlr_jax.formats.files import staged_folder
from t2mlr_jax.storage import full_disk
from t2mlr_jax.storage.checkpoint import Checkpointer
from t2mlr_jax.storage.full_disk import NoSpaceError
from t2mlr_jax.storage.workdir import read_sessions, write_atomic
from t2mlr_jax.train.metrics_log import MetricsLog
from tests.faults.tiny_run import STEPS, assert_same_state, final_state, records, train_tiny
from tests.interop.helpers import tiny_llama_config
from tests.test_main import ROOT

pytestmark = [pytest.mark.xdist_group("faults"), pytest.mark.slow]

ENOSPC = os.strerror(errno.ENOSPC)


def _ended(workdir) -> tuple:
    last = read_sessions(workdir)[-1]
    return last["event"], last["step"], last.get("how")


def test_a_full_disk_stops_cleanly_and_the_reruns_resume_bitwise(tmp_path, monkeypatch, straight):
    workdir = tmp_path / "run"

    # 1. The metrics line of step 3 finds no space.
    write = MetricsLog.write

    def metrics_full(self, step, split, metrics):
        if step == 3:
            raise OSError(errno.ENOSPC, ENOSPC, str(self.jsonl_path))
        return write(self, step, split, metrics)

    monkeypatch.setattr(MetricsLog, "write", metrics_full)
    with pytest.raises(
        NoSpaceError, match=rf"^no space left on device writing {workdir}/metrics.jsonl; the "
    ):
        train_tiny(workdir)
    assert _ended(workdir) == ("end", 2, "no_space")
    monkeypatch.undo()

    # 2. No room for the checkpoint of step 5: refused before orbax writes anything.
    usage, calls = namedtuple("usage", "total used free"), []

    def disk_usage(path):
        calls.append(path)
        return usage(10**9, 10**9, 0 if len(calls) == 3 else 10**9)  # the saves of steps 3, 4, 5

    monkeypatch.setattr(full_disk.shutil, "disk_usage", disk_usage)
    with pytest.raises(
        NoSpaceError, match=r"checkpoints \(it needs \d+ bytes\); the last checkpoint \(step 4\)"
    ):
        train_tiny(workdir)
    assert _ended(workdir) == ("end", 4, "no_space")
    monkeypatch.undo()

    # 3. The save of step 8 runs out of space midway, its step folder half-written.
    save = Checkpointer.save

    def cut_short(self, step, state, *args, **kwargs):
        if step == 8:
            partial = self.directory / "8.orbax-checkpoint-tmp" / "state"
            partial.mkdir(parents=True)
            (partial / "d").write_bytes(b"half of it")
            raise OSError(errno.ENOSPC, ENOSPC, str(partial / "d"))
        return save(self, step, state, *args, **kwargs)

    monkeypatch.setattr(Checkpointer, "save", cut_short)
    with pytest.raises(
        NoSpaceError, match=r"8.orbax-checkpoint-tmp/state/d; the unfinished save of step 8 was removed \("
    ):
        train_tiny(workdir)
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == [str(s) for s in range(2, 8)]
    assert _ended(workdir) == ("end", 7, "no_space")
    monkeypatch.undo()

    assert train_tiny(workdir)["steps"] == STEPS  # space freed: resumed from step 7
    assert_same_state(straight[0], final_state(workdir))
    assert records(workdir) == straight[1]
    assert [r.get("how") for r in read_sessions(workdir) if r["event"] == "end"] == [
        "no_space",
        "no_space",
        "no_space",
        "finished",
    ]


@pytest.fixture(scope="module")
def orbax_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("export")
    LlamaForCausalLM(tiny_llama_config()).save_pretrained(folder / "hf")
    convert = runpy.run_path(os.path.join(ROOT, "tools", "convert_checkpoint.py"))["main"]
    assert convert(["--from", "hf", "--to", "orbax", str(folder / "hf"), str(folder / "orbax")]) == 0
    return convert, folder / "orbax"


def test_an_export_that_finds_no_space_leaves_the_old_one_intact(tmp_path, monkeypatch, capsys, orbax_model):
    convert, model = orbax_model
    target = tmp_path / "hf"
    assert convert(["--from", "orbax", "--to", "hf", str(model), str(target)]) == 0
    before = {p: p.read_bytes() for p in target.rglob("*") if p.is_file()}

    def full(folder, state):
        (folder / "model.safetensors").write_bytes(b"the first megabytes")
        raise OSError(errno.ENOSPC, ENOSPC, str(folder / "model.safetensors"))

    monkeypatch.setattr(hf, "write_state_dict", full)
    capsys.readouterr()
    assert convert(["--from", "orbax", "--to", "hf", "--overwrite", str(model), str(target)]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]  # beside the progress bars
    assert len(errors) == 1 and "Traceback" not in err, err
    assert "No space left on device" in errors[0] and "model.safetensors" in errors[0], errors
    assert {p: p.read_bytes() for p in target.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # no stage left beside it


_KILLED_MIDWAY = """
import os, signal, sys
from pathlib import Path
from t2mlr_jax.formats import hf
from t2mlr_jax.formats.files import staged_folder
with staged_folder(sys.argv[1]) as stage:
    (stage / "model.safetensors").write_bytes(b"half")
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_an_export_killed_midway_leaves_the_target_as_it_was(tmp_path):
    target = tmp_path / "model"
    target.mkdir()
    (target / "config.json").write_text("old")
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_MIDWAY, str(target)],
        env={**os.environ, "PYTHONPATH": ROOT},
        capture_output=True,
    )
    assert killed.returncode == -signal.SIGKILL
    assert [p.name for p in target.iterdir()] == ["config.json"] and (
        target / "config.json"
    ).read_text() == "old"
    # The next export clears the stage the kill left, and a target set aside mid-swap is put back first.
    target.rename(tmp_path / ".model.replaced")
    with staged_folder(target) as stage:
        assert sorted(p.name for p in stage.iterdir()) == ["config.json"]  # the old one, to be overwritten
        (stage / "model.safetensors").write_bytes(b"new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "model.safetensors"]


def test_a_report_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    report = tmp_path / "aot.json"
    write_atomic(report, '{"complete": 1}')
    real_write = type(report).write_text

    def cut_short(self, text, *args, **kwargs):
        real_write(self, text[:3], *args, **kwargs)
        raise OSError(errno.ENOSPC, ENOSPC, str(self))

    monkeypatch.setattr(type(report), "write_text", cut_short)
    with pytest.raises(OSError, match="No space left on device"):
        write_atomic(report, '{"complete": 2}')
    monkeypatch.undo()
    assert report.read_text() == '{"complete": 1}' and [p.name for p in tmp_path.iterdir()] == ["aot.json"]
