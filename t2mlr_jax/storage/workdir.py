"""A run's workdir, in one place: the names main.py's writers give its files, which checkpoint steps
are finished, and the record of its training sessions. No JAX here, so readers such as tools/report.py
start without it."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import time
from pathlib import Path
from typing import Any

RUN_CONFIG = "run_config.json"  # the run's identity (run_config.check_workdir)
METRICS = "metrics.jsonl"  # metrics_log.MetricsLog
SUMMARY = "summary.json"  # trainer.train, compare.write_comparison
CHECKPOINTS = "checkpoints"  # orbax step folders, one per saved step
CORRUPT = "corrupt_checkpoints"  # step folders proven unreadable, set aside (checkpoint.Checkpointer)
SESSIONS = "sessions.jsonl"  # one "start" and (unless killed) one "end" line per training session
PROFILE = "profile"  # a jax.profiler trace of train.profile's steps (train.profiling)
LOCK = "train.lock"  # the one writer's pid and host while a session trains (storage.workdir_lock)

# How a session ended ("end" lines): trained to train.steps, stopped by a signal (resumable), by the
# non-finite guard, or by a full disk (resumable once there is space). A "start" line without its "end" is a
# session that was killed.
ENDINGS = ("finished", "SIGTERM", "SIGINT", "nonfinite", "no_space")


def saved_steps(directory: Path | str) -> list[int]:
    """The finished checkpoints in a checkpoints/ folder (orbax renames a step folder to its bare number
    only once the save completed)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.is_dir() and p.name.isdigit())


UNFINISHED_SAVE = re.compile(r"\d+\.orbax-checkpoint-tmp.*")  # a save cut short; orbax's own to clean up


class UnexpectedCheckpointError(ValueError):
    """A checkpoints/ folder holds something that is not a checkpoint this trainer wrote."""


def check_checkpoints(directory: Path | str) -> None:
    """Refuse (UnexpectedCheckpointError naming it) a checkpoints/ folder holding anything but step folders
    and orbax's unfinished saves: a file where a step belongs, a name we did not write. Such a folder is not
    "no checkpoint": training would start over and overwrite the run's history."""
    directory = Path(directory)
    if not directory.exists():
        return
    if not directory.is_dir():
        strays = [directory]
    else:
        strays = [
            p
            for p in sorted(directory.iterdir())
            if not (p.is_dir() and (p.name.isdigit() or UNFINISHED_SAVE.fullmatch(p.name)))
        ]
    if strays:
        what = "a file" if not strays[0].is_dir() else "a folder"
        more = f" (and {len(strays) - 1} more)" if len(strays) > 1 else ""
        raise UnexpectedCheckpointError(
            f"{strays[0]} is {what} this trainer did not write{more}: a checkpoints folder holds only step "
            "folders. Move it out (a training run never deletes what it did not write) and rerun. "
            "Nothing was changed."
        )


def write_atomic(path: Path | str, text: str) -> None:
    """Write `text` to `path` whole or not at all: a kill or a full disk leaves the old file (or none)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def move_aside(path: Path, folder: Path) -> Path:
    """Move `path` into `folder` under its own name, or name-1, name-2, ... when taken (never overwrite)."""
    target = folder / path.name
    for n in range(1, 1000):
        if not target.exists():
            break
        target = folder / f"{path.stem}-{n}{path.suffix}"
    folder.mkdir(parents=True, exist_ok=True)
    shutil.move(str(path), str(target))
    return target


def log_session(workdir: Path | str, event: str, step: int, **fields: Any) -> None:
    """Append one line to workdir/sessions.jsonl: {"event": "start" | "end", "step", "time", "pid",
    "host", **fields} ("end" lines carry "how", one of ENDINGS)."""
    record = {
        "event": event,
        "step": int(step),
        "time": round(time.time(), 3),
        "pid": os.getpid(),
        "host": socket.gethostname(),
        **fields,
    }
    with open(Path(workdir) / SESSIONS, "a") as f:
        f.write(json.dumps(record) + "\n")


def read_sessions(workdir: Path | str) -> list[dict]:
    """The session records of a workdir, oldest first ([] for runs older than the record); a torn last
    line (a session killed mid-write) is skipped."""
    path = Path(workdir) / SESSIONS
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def lock_owner(workdir: Path | str) -> dict | None:
    """The {"pid", "host", "time"} record of workdir/train.lock (written by the session that took it); None
    when there is none or it cannot be read (its owner is writing it). A killed owner's record stays."""
    try:
        owner = json.loads((Path(workdir) / LOCK).read_text())
    except (OSError, ValueError):
        return None
    return owner if isinstance(owner, dict) and {"pid", "host", "time"} <= owner.keys() else None
