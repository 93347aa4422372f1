"""A full disk, told once: what a write that found no space reads like (Python's OSError, or tensorstore's
RESOURCE_EXHAUSTED inside an orbax save), where it failed and how many bytes it wanted, and the unfinished
step folders such a save leaves. No JAX here."""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
from contextlib import contextmanager
from pathlib import Path

from t2mlr_jax.storage.workdir import UNFINISHED_SAVE

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
# tensorstore's own words (orbax raises them as a ValueError): 'Failed to write 137075 bytes to file 7: No
# space left on device [os_error_code='28']', after the path it was writing
_TENSORSTORE = re.compile(r"os_error_code='(\d+)'")
_FAILED_PATH = re.compile(r'Failed writing: "([^"]+)"')
_WANTED = re.compile(r"Failed to write (\d+) bytes")


class NoSpaceError(RuntimeError):
    """A write found the disk (or the quota) full; what was half-written is removed, the rest is intact."""


def _chain(error: BaseException):
    while error is not None:
        yield error
        error = error.__cause__ or error.__context__


def _tensorstore_says_no_space(text: str) -> bool:
    code = _TENSORSTORE.search(text)
    return bool(code) and int(code.group(1)) in NO_SPACE


def _says_no_space(error: BaseException) -> bool:
    """Whether this one error (not what caused it) is a write that found no space."""
    is_os_error = isinstance(error, OSError) and error.errno in NO_SPACE
    return is_os_error or _tensorstore_says_no_space(str(error))


def is_no_space(error: BaseException) -> bool:
    """Whether `error` (or what caused it) is a write that found no space."""
    return any(_says_no_space(e) for e in _chain(error))


def where_and_wanted(error: BaseException) -> tuple[str | None, int | None]:
    """(the path whose write failed, the bytes that write wanted), each None where the error does not say."""
    for e in filter(_says_no_space, _chain(error)):
        if isinstance(e, OSError) and e.errno in NO_SPACE:
            return e.filename and str(e.filename), getattr(e, "wanted", None)
        path, wanted = _FAILED_PATH.search(str(e)), _WANTED.search(str(e))
        return path and path.group(1), wanted and int(wanted.group(1))
    return None, None


def require_space(folder: Path, wanted: int) -> None:
    """An ENOSPC OSError (with `.wanted`) unless `folder`'s file system has `wanted` bytes free: a save
    refused before it starts leaves nothing to clean up (a save that runs out of space midway makes
    orbax's writer threads fail one by one)."""
    free = shutil.disk_usage(folder).free
    if free < wanted:
        error = OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}: {free} bytes free", str(folder))
        error.wanted = wanted
        raise error


def remove_unfinished_saves(directory: Path) -> list[Path]:
    """Remove the step folders a save cut short left in checkpoints/ (orbax's temporary names: never a
    finished checkpoint); the removed paths."""
    directory = Path(directory)
    unfinished = (
        [p for p in directory.iterdir() if UNFINISHED_SAVE.fullmatch(p.name)] if directory.is_dir() else []
    )
    for path in unfinished:
        shutil.rmtree(path, ignore_errors=True)
    return unfinished


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in Path(folder).rglob("*") if f.is_file())


class _DropNoSpace(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info and record.exc_info[1]
        return not (_tensorstore_says_no_space(record.getMessage()) or (error and is_no_space(error)))


@contextmanager
def told_once():
    """Within the block, orbax's threads do not log a full disk (each of them would, with its traceback):
    the trainer reports it, once."""
    absl_logger, dropped = logging.getLogger("absl"), _DropNoSpace()
    absl_logger.addFilter(dropped)
    try:
        yield
    finally:
        absl_logger.removeFilter(dropped)
