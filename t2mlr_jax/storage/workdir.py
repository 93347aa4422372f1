"""A run's workdir, in one place: the names main.py's writers give its files, which checkpoint steps
are finished, and the record of its training sessions. No JAX here, so readers such as tools/report.py
start without it."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

RUN_CONFIG = "run_config.json"  # the run's identity (checkpoint.check_workdir)
METRICS = "metrics.jsonl"  # metrics_log.MetricsLog
SUMMARY = "summary.json"  # trainer.train, compare.write_comparison
CHECKPOINTS = "checkpoints"  # orbax step folders, one per saved step
CORRUPT = "corrupt_checkpoints"  # step folders proven unreadable, set aside (checkpoint.Checkpointer)
SESSIONS = "sessions.jsonl"  # one "start" and (unless killed) one "end" line per training session
LOCK = "train.lock"  # the one writer's pid and host while a session trains (storage.workdir_lock)

# How a session ended ("end" lines): trained to train.steps, stopped by a signal (resumable), or by the
# non-finite guard. A "start" line without its "end" is a session that was killed.
ENDINGS = ("finished", "SIGTERM", "SIGINT", "nonfinite")


def saved_steps(directory: Path | str) -> list[int]:
    """The finished checkpoints in a checkpoints/ folder (orbax renames a step folder to its bare number
    only once the save completed)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.is_dir() and p.name.isdigit())


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
