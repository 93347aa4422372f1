"""A second main.py on a workdir in use (plain, --seeds with --workers, several architectures, several
architectures of which one sub-run is in use) is refused before anything else: exit status 2 within 3 s
(the sub-run once the config is read), one line naming the owner and nothing else printed, every file of
the workdir byte-identical afterwards. A workdir that cannot be written (an OSError(EROFS) injected where
the lock file is opened, in the process itself) is one line too, with nothing changed."""

import errno
import hashlib
import os
import shutil
import subprocess
import sys
import time

import pytest

from t2mlr_jax.storage.workdir_lock import WorkdirUnwritableError, workdir_lock
from tests.faults.tiny_run import train_tiny
from tests.test_main import ROOT, S5, TINY, main

pytestmark = pytest.mark.xdist_group("faults")

FORMS = {  # the command's extra flags, the folder of the workdir the owner holds, and the refusal's limit
    "plain": ([], ".", 3),
    "seeds and workers": (["--seeds=0,1", "--workers=2"], ".", 3),
    "several architectures": (["--config.arch=t2mlr,transformer"], ".", 3),
    # a sub-run's folder is known once the config is read (JAX imported): later, still before anything
    "several architectures, one sub-run in use": (["--config.arch=t2mlr,transformer"], "transformer", 15),
}


def _tree(folder) -> dict:
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("form", list(FORMS))
def test_a_second_writer_is_refused_at_once_and_changes_nothing(_stopped, tmp_path, form):
    args, owned, limit = FORMS[form]
    workdir = tmp_path / "run"
    shutil.copytree(_stopped, workdir / "t2mlr")  # a sub-run with checkpoints, metrics and sessions
    (workdir / "worker0.log").write_text("the owner's live worker log\n")
    with workdir_lock(workdir / owned):  # the owner, training
        before = _tree(workdir)
        started = time.monotonic()
        out = main(f"--config={S5}:cpu", *TINY, *args, f"--workdir={workdir}")
        elapsed = time.monotonic() - started
        assert _tree(workdir) == before
    assert out.returncode == 2 and out.stdout == "", (out.stdout, out.stderr[-3000:])
    holder = workdir / owned if owned != "." else workdir
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr[-3000:]
    assert lines[0].startswith(f"error: {holder} is being trained by pid {os.getpid()} on host "), lines
    assert elapsed <= limit, f"refused after {elapsed:.1f} s"


def _read_only_lock(monkeypatch):
    real_open = os.open

    def refusing(path, *args, **kwargs):
        if str(path).endswith("train.lock"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing)


def test_a_read_only_workdir_is_one_line_and_nothing_changes(tmp_path, monkeypatch):
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "notes.txt").write_text("kept")
    _read_only_lock(monkeypatch)
    with pytest.raises(
        WorkdirUnwritableError, match=rf"^{workdir} cannot be written \(Read-only file system\)"
    ):
        train_tiny(workdir)
    assert [p.name for p in workdir.iterdir()] == ["notes.txt"]
    # main.py: the same OSError at the same place, in the process itself
    inject = (
        "import errno, os, runpy, sys; real = os.open\n"
        "def refusing(path, *a, **k):\n"
        "    if str(path).endswith('train.lock'):\n"
        "        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))\n"
        "    return real(path, *a, **k)\n"
        "os.open = refusing; sys.argv = sys.argv[1:]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            inject,
            os.path.join(ROOT, "main.py"),
            f"--config={S5}:cpu",
            *TINY,
            f"--workdir={workdir}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.strip().splitlines() == [
        f"error: {workdir} cannot be written (Read-only file system): give a --workdir this user can write. "
        "Nothing was changed."
    ]
    assert [p.name for p in workdir.iterdir()] == ["notes.txt"]
