"""One writer per workdir: a training session holds workdir/train.lock while it trains.

The lock is an advisory `flock` on the file, held for the session: the kernel drops it when its owner
exits, however it exits (SIGKILL included), so a killed owner's lock is stale by construction and the
next session takes it without asking. The file names the holder (pid, host, start time) for the refusal
message. In a multi-host job only process 0 writes the workdir, so only it takes the lock; a second job
(any host, on a file system with working `flock`: local disks, NFSv4) is refused. No JAX here.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path

from t2mlr_jax.storage.workdir import LOCK, lock_owner


class WorkdirLockedError(RuntimeError):
    """Another live session trains in this workdir."""


class WorkdirUnwritableError(RuntimeError):
    """The workdir (or a folder above it) cannot be created or written: read-only, no permission."""


_HELD: set[Path] = set()  # the lock files this process holds: flock is per open file, so a second open in
# the same process would refuse its own holder (main.py locks, then trainer.train locks again)


def _unwritable(folder: Path, error: OSError) -> WorkdirUnwritableError:
    return WorkdirUnwritableError(
        f"{folder} cannot be written ({error.strerror or error}): give a --workdir this user can write. "
        "Nothing was changed."
    )


def _holder(workdir: Path) -> str:
    owner = lock_owner(workdir)
    if owner is None:  # the owner is still writing its record
        return "another process"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(owner["time"]))
    return f"pid {owner['pid']} on host {owner['host']} (since {since})"


def _acquire(path: Path) -> int | None:
    """The open, locked file descriptor of `path`; None where the file system has no `flock`."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _unwritable(Path(e.filename or path.parent), e) from None
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise _unwritable(path.parent, e) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EACCES):
                raise WorkdirLockedError(
                    f"{path.parent} is being trained by {_holder(path.parent)}: a workdir has one writer. "
                    "Wait for it to finish, or use another --workdir. Nothing was changed."
                ) from None
            logging.warning("%s: no file locking on this file system (%s); not locked", path, e)
            return None
        try:  # a releasing owner unlinks the file: a lock on that old inode guards nothing, take the new one
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    record = {"pid": os.getpid(), "host": socket.gethostname(), "time": round(time.time(), 3)}
    try:
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(record).encode())
        os.fsync(fd)
    except OSError as e:  # a full disk: nothing of this session was written yet
        os.close(fd)
        path.unlink(missing_ok=True)
        raise _unwritable(path.parent, e) from None
    return fd


@contextmanager
def workdir_lock(workdir: Path | str, *, lead: bool = True):
    """Hold workdir/train.lock for the block; WorkdirLockedError (nothing written) if a live session holds
    it, WorkdirUnwritableError if the folder cannot be written. `lead`: whether this process writes the
    workdir (process 0 of a multi-host job); others skip. Re-entrant within a process."""
    path = Path(workdir).absolute() / LOCK
    if not lead or path in _HELD:
        yield
        return
    created = [d for d in (path.parent, *path.parent.parents) if not d.exists()]
    try:
        fd = _acquire(path)
        _HELD.add(path)
        try:
            yield
        finally:
            _HELD.discard(path)
            if fd is not None:
                path.unlink(missing_ok=True)  # before the unlock: a waiting newcomer then sees no stale file
                os.close(fd)
    finally:
        for folder in created:  # a session that wrote nothing leaves no workdir behind
            if folder.exists() and not any(folder.iterdir()):
                folder.rmdir()
