"""Independent runs of one command spread over local processes (`--workers=N`): worker I is the command
itself with `--shard=I/N` and trains every N-th run from the I-th; the parent waits under one progress bar,
passes signals on, and afterwards reads the finished runs back. On a 2-core CPU one process keeps about
1.3 cores busy (and compiles on one), so two workers finish a set of small runs ~1.4x sooner."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm

from t2mlr_jax.storage.workdir import SUMMARY


class WorkerFailed(RuntimeError):
    """A worker exited with an error: its log's error line, the status and where the whole log is."""


def parse_shard(text: str) -> tuple[int, int]:
    """`I/N` -> (I, N), 0 <= I < N; ValueError naming the problem otherwise."""
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard: expected I/N, got {text!r}") from None
    if not 0 <= index < count:
        raise ValueError(f"--shard={text}: I must be in 0..N-1")
    return index, count


def shard_of(items: Sequence, shard: tuple[int, int] | None) -> list:
    """The items shard I of N runs: every N-th from the I-th (all of them without a shard)."""
    if shard is None:
        return list(items)
    index, count = shard
    return list(items[index::count])


def run_workers(
    commands: list[list[str]], logs: Path, workdirs: list[Path], env: dict[str, str] | None = None
) -> bool:
    """Run the shards' commands side by side (worker I's output in <logs>/worker<I>.log) under one progress
    bar over the runs' workdirs (a run counts once its summary.json exists). A signal to this process is
    passed on (each worker stops at its next step, resumable by a rerun); a failed worker stops the others
    and raises WorkerFailed. Whether every worker finished (False: stopped by a signal)."""
    paths = [logs / f"worker{i}.log" for i in range(len(commands))]
    procs = []
    for command, path in zip(commands, paths):
        with open(path, "w") as log:  # its own session: a terminal's Ctrl-C reaches it once, through us
            procs.append(
                subprocess.Popen(
                    command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
                )
            )
    stopped, failed = [], []

    def forward(signum, frame):
        stopped.append(signum)
        for p in procs:
            p.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    finished = lambda: sum((d / SUMMARY).exists() for d in workdirs)
    try:
        desc = f"runs, {len(procs)} workers"
        with tqdm(total=len(workdirs), initial=finished(), desc=desc, file=sys.stderr) as bar:
            while any(p.poll() is None for p in procs):
                time.sleep(1)
                bar.update(finished() - bar.n)
                if not failed and not stopped:
                    failed += [(p, path) for p, path in zip(procs, paths) if p.poll()]
                    for p in procs if failed else ():
                        p.terminate()  # stops at its next step, resumable
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    failed = failed or [(p, path) for p, path in zip(procs, paths) if p.returncode and not stopped]
    for p, path in failed[:1]:  # its error line, else its last (progress bars end their lines with \r)
        lines = [line.strip() for line in re.split(r"[\r\n]", path.read_text()) if line.strip()]
        errors = [line.removeprefix("error: ") for line in lines if line.startswith("error: ")]
        last = (errors or lines or ["(no output)"])[-1]
        raise WorkerFailed(f"{path.stem} exited with status {p.returncode}: {last} (all of it: {path})")
    return not stopped


def with_pythonpath(root: Path) -> dict[str, str]:
    """This environment with `root` first on PYTHONPATH (a `python -m package.module` worker from any cwd)."""
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path}
