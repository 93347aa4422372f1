"""The ways a training session ends before train.steps, each leaving the workdir resumable: a step
whose loss or gradient norm is not finite (`non_finite`: logged and skipped under train.nan_policy "skip",
else NonFiniteError before anything of it is saved), a SIGTERM/SIGINT (`stop_on_signals`: the loop
finishes its step, saves and exits, as on preemption) and a full disk (`out_of_space`: the unfinished save
removed, the session record closed, one line that says so). They are the trainer's (t2mlr_jax.train.trainer),
kept apart from its loop, which calls them.
"""

from __future__ import annotations

import logging
import os
import signal
from contextlib import contextmanager
from typing import TYPE_CHECKING

import jax
import numpy as np

from t2mlr_jax.storage import full_disk
from t2mlr_jax.storage.workdir import CHECKPOINTS, log_session, read_sessions, saved_steps
from t2mlr_jax.train.metrics_log import MetricsLog

if TYPE_CHECKING:
    from t2mlr_jax.train.trainer import Run


class NonFiniteError(RuntimeError):
    """Training met a non-finite step (train.nan_policy "stop", or past train.nan_skip_limit skips)."""


def non_finite(step: int, metrics: dict, skips: int, t, log: MetricsLog, last_saved: list[int]) -> int:
    """Log a step that was not applied; raise NonFiniteError unless the policy skips it. The new count."""
    host = {k: float(v) for k, v in jax.device_get(metrics).items() if k in ("loss", "grad_norm")}
    bad = [
        label
        for name, label in (("loss", "loss"), ("grad_norm", "gradient norm"))
        if not np.isfinite(host[name])
    ]
    log.write(step, "nonfinite", {**host, "skips": skips + 1, "policy": t.nan_policy})
    found = (
        f"step {step}: non-finite {' and '.join(bad)} "
        f"(loss {host['loss']}, gradient norm {host['grad_norm']})"
    )
    if t.nan_policy == "skip" and skips < t.nan_skip_limit:
        logging.warning("%s: step skipped (%d of at most %d)", found, skips + 1, t.nan_skip_limit)
        return skips + 1
    kept = f"the last checkpoint (step {last_saved[-1]}) is intact" if last_saved else "nothing was saved"
    if t.nan_policy == "stop":
        why, remedy = "train.nan_policy=stop", "or pass --config.train.nan_policy=skip to skip such steps"
    else:
        why, remedy = f"{skips + 1} > train.nan_skip_limit skips", "or raise train.nan_skip_limit"
    raise NonFiniteError(
        f"{found}; stopped ({why}) without saving it: {kept}. Lower the learning rate, {remedy}"
    )


class StopFlag:
    """Set by SIGTERM/SIGINT: the loop finishes its step, saves and exits (preemption)."""

    def __init__(self):
        self.signal: int | None = None

    def __call__(self, signum, frame):
        self.signal = signum


@contextmanager
def stop_on_signals():
    flag, previous = StopFlag(), {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous[sig] = signal.signal(sig, flag)
    try:
        yield flag
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def out_of_space(run: Run, error: Exception, lead: bool) -> full_disk.NoSpaceError:
    """A write found no space: the save it cut short removed, the session record closed (where there is
    room for its line), and the one line that says so."""
    path, wanted = full_disk.where_and_wanted(error)
    checkpoints = run.workdir / CHECKPOINTS
    removed = full_disk.remove_unfinished_saves(checkpoints) if lead else []
    steps = saved_steps(checkpoints)
    sessions = read_sessions(run.workdir) if lead else []
    if sessions and sessions[-1]["event"] == "start" and sessions[-1]["pid"] == os.getpid():
        try:
            log_session(run.workdir, "end", steps[-1] if steps else 0, how="no_space")
        except OSError:  # still full: the record shows a start without its end, as a kill's would
            pass
    needed = f" (it needs {wanted} bytes)" if wanted else ""
    if removed:
        cut = ", ".join(p.name.split(".")[0] for p in removed)
        size = (
            f" (a checkpoint takes {full_disk.folder_bytes(checkpoints / str(steps[-1]))} bytes)"
            if steps
            else ""
        )
        needed += f"; the unfinished save of step {cut} was removed{size}"
    kept = f"the last checkpoint (step {steps[-1]}) is intact" if steps else "no checkpoint was saved yet"
    return full_disk.NoSpaceError(
        f"no space left on device writing {path or run.workdir}{needed}; {kept}. Free space and rerun the "
        "same command to resume"
    )
