"""How a run ended, from its sessions.jsonl (t2mlr_jax/storage/workdir.py): each training session's "start"
line and, unless it was killed, its "end" line saying how. Runs older than that record fall back on
metrics.jsonl, where a "nonfinite" line after the last train line is the NaN guard's stop. A summary.json
older than the last session's start is an earlier session's and is ignored, with a note."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from t2mlr_jax.analysis.run_logs import fmt, read_json
from t2mlr_jax.storage.workdir import METRICS, SESSIONS, SUMMARY, lock_owner, read_sessions


def clock(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def sessions_of(records: list[dict]) -> list[dict]:
    """sessions.jsonl's lines paired: {"start", "end", "how"} per session; a session without its "end"
    line (the next "start" came first, or none did) was killed, or still trains."""
    sessions = []
    for record in records:
        if record.get("event") == "start":
            sessions.append({"start": record, "end": None, "how": "killed"})
        elif record.get("event") == "end" and sessions and sessions[-1]["end"] is None:
            sessions[-1].update(end=record, how=record.get("how", "?"))
    return sessions


def still_training(path: Path, start: dict) -> bool:
    """Whether the session of this "start" line trains now: workdir/train.lock names its process, alive on
    this host. A killed owner leaves the file behind; an owner writing it leaves it unreadable a moment."""
    owner, session = lock_owner(path), (start.get("pid"), start.get("host"))
    if owner is None or session[1] != socket.gethostname() or (owner["pid"], owner["host"]) != session:
        return False
    try:
        os.kill(owner["pid"], 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        pass
    return True


def nonfinite_text(record: dict | None) -> str:
    if record is None:
        return f"stopped at NaN (the non-finite step's line is not in {METRICS})"
    return (
        f"stopped at NaN: step {record['step']} was non-finite (loss {fmt(record.get('loss', '?'))}, "
        f"gradient norm {fmt(record.get('grad_norm', '?'))}) and not applied"
    )


def resumable_from(latest: int | None) -> str:
    return f"resumable from the checkpoint at step {latest}" if latest is not None else "no checkpoint saved"


def session_text(how: str, session: dict, last_step: int, latest: int | None, stop: dict | None) -> str:
    """The last session's ending as a line."""
    if how == "finished":
        return f"finished at step {session['end']['step']}"
    if how == "nonfinite":
        return f"{nonfinite_text(stop)}; {resumable_from(latest)}"
    if how in ("SIGTERM", "SIGINT"):
        step = session["end"]["step"]
        return f"stopped by {how} at step {step} after saving, resumable (rerun the same command)"
    if how == "no_space":
        step = session["end"]["step"]
        return f"stopped by a full disk, its last checkpoint at step {step}; resumable once there is space"
    if how == "running":
        return f"running (pid {session['start']['pid']} on this host), last logged step {last_step}"
    if how == "killed":
        return f"killed (no end record in {SESSIONS}) after step {last_step}; {resumable_from(latest)}"
    return f"ended as {how!r} at step {session['end']['step']}"


def resume_count(sessions: list[dict]) -> int:
    """Sessions that started from a checkpoint."""
    return sum(1 for s in sessions if s["start"].get("step", 0) > 0)


def resumed_text(sessions: list[dict]) -> str:
    resumes = resume_count(sessions)
    if not resumes:
        return ""
    earlier = ", ".join(s["how"] for s in sessions[:-1])
    return f"; resumed {resumes} time{'s' if resumes != 1 else ''} (earlier sessions: {earlier})"


def run_ending(path: Path, records: list[dict], latest: int | None) -> dict:
    """How the run ended, from sessions.jsonl or (runs from before it) metrics.jsonl: {"how" (one of
    workdir.ENDINGS, "killed", "running", "unknown"), "text" (one line), "resumes", "sessions", "nonfinite"
    (the line of the step that stopped it), "skipped_nonfinite" (steps nan_policy=skip skipped)}."""
    nonfinite = [r for r in records if r["split"] == "nonfinite"]
    last_step = max((r["step"] for r in records), default=0)
    sessions = sessions_of(read_sessions(path))
    if sessions:
        last = sessions[-1]
        how = "running" if last["end"] is None and still_training(path, last["start"]) else last["how"]
        stop = nonfinite[-1] if how == "nonfinite" and nonfinite else None
        last_step = max(last_step, last["start"].get("step", 0))
        text = session_text(how, last, last_step, latest, stop) + resumed_text(sessions)
    else:
        last_train = max((i for i, r in enumerate(records) if r["split"] == "train"), default=-1)
        stop = nonfinite[-1] if nonfinite and records.index(nonfinite[-1]) > last_train else None
        how = "nonfinite" if stop else "unknown"
        text = (
            f"{nonfinite_text(stop)}; {resumable_from(latest)}"
            if stop
            else f"ending unknown (no {SESSIONS}: a run from before it), last logged step {last_step}"
        )
    skipped = len(nonfinite) - (stop is not None)
    if skipped:
        text += f"; {skipped} non-finite step{'s' if skipped != 1 else ''} skipped (train.nan_policy=skip)"
    return {
        "how": how,
        "text": text,
        "resumes": resume_count(sessions) if sessions else None,
        "sessions": sessions,
        "nonfinite": stop,
        "skipped_nonfinite": skipped,
    }


def current_summary(path: Path, sessions: list[dict]) -> tuple[dict | None, str | None]:
    """(summary.json, None), or (None, why it was ignored) when it is older than the last session's start:
    an earlier session wrote it, and the last one has not (it stopped, was killed, or still trains)."""
    summary = read_json(path / SUMMARY)
    started = sessions[-1]["start"].get("time") if sessions else None
    if summary is None or started is None:
        return summary, None
    written = (path / SUMMARY).stat().st_mtime
    if written >= started:
        return summary, None
    return None, (
        f"{SUMMARY} ignored: written {clock(written)}, before the last session started ({clock(started)}), "
        "so it is an earlier session's"
    )
