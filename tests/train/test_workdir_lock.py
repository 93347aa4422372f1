"""One writer per workdir: a second holder is refused naming the first, a dead owner's lock is stale, only
the lead process of a multi-host job takes it, and a session that wrote nothing leaves no workdir."""

import json
import os
import re
import socket
import subprocess
import sys

from t2mlr_jax.storage.workdir import LOCK
from t2mlr_jax.storage.workdir_lock import workdir_lock


def test_a_second_holder_is_refused_naming_the_first(tmp_path):
    second = (
        "from t2mlr_jax.storage.workdir_lock import workdir_lock\n"
        + f"with workdir_lock({str(tmp_path)!r}): pass"
    )
    with workdir_lock(tmp_path):
        owner = json.loads((tmp_path / LOCK).read_text())
        assert (owner["pid"], owner["host"]) == (os.getpid(), socket.gethostname())
        out = subprocess.run([sys.executable, "-c", second], capture_output=True, text=True, timeout=60)
        refused = rf"WorkdirLockedError: {tmp_path} is being trained by pid {os.getpid()} on host .*Nothing"
        assert out.returncode == 1 and re.search(refused, out.stderr), out.stderr[-2000:]
        with workdir_lock(tmp_path):  # its holder may take it again (main.py locks, then the trainer)
            pass
        assert json.loads((tmp_path / LOCK).read_text()) == owner  # the refused one wrote nothing
    assert not (tmp_path / LOCK).exists()
    with workdir_lock(tmp_path):  # released: the next session takes it
        pass


def test_a_dead_owners_lock_is_stale(tmp_path):
    # A process that takes the lock and dies without releasing it (as SIGKILL would leave it).
    code = (
        "import os\n"
        "from t2mlr_jax.storage.workdir_lock import workdir_lock\n"
        f"held = workdir_lock({str(tmp_path)!r})\n"
        "held.__enter__()\n"
        "os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    stale = json.loads((tmp_path / LOCK).read_text())
    assert stale["pid"] != os.getpid()
    with workdir_lock(tmp_path):
        assert json.loads((tmp_path / LOCK).read_text())["pid"] == os.getpid()


def test_only_the_lead_process_takes_it_and_an_unused_workdir_is_removed(tmp_path):
    with workdir_lock(tmp_path / "a" / "b", lead=False):
        assert not (tmp_path / "a").exists()
    with workdir_lock(tmp_path / "a" / "b"):
        assert (tmp_path / "a" / "b" / LOCK).exists()
    assert not (tmp_path / "a").exists()
    (tmp_path / "kept").mkdir()
    with workdir_lock(tmp_path / "kept"):
        (tmp_path / "kept" / "metrics.jsonl").touch()
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["metrics.jsonl"]
