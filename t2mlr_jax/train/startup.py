"""Where a run's start-up goes: the seconds from the process's start to its first finished step, by phase,
written to WORKDIR/startup.json by the lead host when the first step of a session ends
(experiments/startup.py reads it).

Phases, in the order a training session passes them (each the time since the previous mark):
  imports     process start -> main() entered (Python, JAX, the package)
  config      flags, the config, the data source, the architecture: everything checked, nothing compiled
  state       the starting state: initialised (its compile included) or restored from a checkpoint
  trace       the first step's function traced to a jaxpr
  compile     lowered and compiled by XLA (or loaded from the persistent compilation cache)
  data        the first batch (the input pipeline starts only now, after the step is compiled)
  first_step  the first step run, to its metrics on the host
A phase a session does not pass is absent (a second architecture of one run has no imports or config).
The recirculation sweep (nothing to train) records imports, config, data, state and first_step: its first
cell, traced, compiled and scored."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

STARTUP = "startup.json"
PHASES = ("imports", "config", "state", "trace", "compile", "data", "first_step")


def _process_start() -> float:
    """time.time() at this process's start, read from /proc (Linux, 10 ms resolution); elsewhere the time
    this module was imported, which leaves out the interpreter's start and the imports before it."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: start, clock ticks after boot
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - age
    except (OSError, ValueError, IndexError, AttributeError):
        return time.time()


class _Clock:
    def __init__(self):
        self.last, self.phases = _process_start(), {}

    def mark(self, phase: str) -> None:
        if phase not in PHASES:
            raise ValueError(f"unknown start-up phase {phase!r}; expected one of {PHASES}")
        now = time.time()
        self.phases[phase] = round(now - self.last, 3)
        self.last = now

    def write(self, workdir: Path, **about) -> dict:
        """The phases marked since the last write, to workdir/startup.json (with `about`); then a new
        record starts."""
        record = {"phases": self.phases, "seconds": round(sum(self.phases.values()), 3), **about}
        Path(workdir, STARTUP).write_text(json.dumps(record, indent=2))
        self.phases = {}
        return record


_clock = _Clock()
mark = _clock.mark
write = _clock.write
