"""What both sides of a release comparison (experiments/vs_release.py) share, stdlib only: a release-side
driver imports it under the release's own Python. A driver pins its threads before torch or XLA starts,
times each program with `timed_calls`, and prints `result(...)` as its one JSON line.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import sys
import time
from collections.abc import Callable


def pin_threads(threads: int) -> None:
    """Run on `threads` CPUs (the same on both sides), before torch or XLA sizes its thread pools."""
    cpus = sorted(os.sched_getaffinity(0))
    if threads < len(cpus):
        os.sched_setaffinity(0, cpus[:threads])


def timed_calls(fn: Callable, repeats: int, wait: Callable = lambda x: x) -> tuple[list[float], object]:
    """(seconds of `repeats` calls after one warm-up call, the warm-up call's result); `wait` blocks on a
    result (jax.block_until_ready for asynchronous dispatch)."""
    first = wait(fn())
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        wait(fn())
        seconds.append(time.perf_counter() - start)
    return seconds, first


def programs_of(rows: dict[str, Callable[[], dict]]) -> dict:
    """A release driver's programs: for each row prefix, its measure's {"train", "decode"} as
    <prefix>_train / <prefix>_decode, each model collected before the next is built."""
    programs = {}
    for name, measure in rows.items():
        measured = measure()
        programs[f"{name}_train"], programs[f"{name}_decode"] = measured["train"], measured["decode"]
        gc.collect()
    return programs


def result(side: str, versions: dict, programs: dict, started: float) -> dict:
    """A driver's JSON line: {"side", "versions", "programs", "peak_rss_bytes", "wall_s"}."""
    return {
        "side": side,
        "versions": {**versions, "python": ".".join(map(str, sys.version_info[:3]))},
        "programs": programs,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,  # Linux: KiB
        "wall_s": time.perf_counter() - started,
    }


def run(main: Callable[[dict], dict]) -> None:
    """A driver's entry point: the spec is argv[1] (JSON), the result one JSON line on stdout."""
    print(json.dumps(main(json.loads(sys.argv[1]))))
