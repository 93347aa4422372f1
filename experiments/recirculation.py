#!/usr/bin/env python
"""The recirculation sweep (Mozer et al.): % perplexity change of a pretrained model against its unmodified
self for every alpha x scheme x (source, destination) pair of config.recirculation's grid, with the
paper's controls (temperature, training-free looping) and a serial check of the parallel two-stack
(passes, perplexity gap, speed-up, timed side by side). This runs main.py (its flags, --help, one-line
errors) with configs/recirculation.py:cpu as the default config; the sweep is
t2mlr_jax.studies.recirculation_sweep, the study main.py runs for arch "recirculation" in --mode=train.

  python -m experiments.recirculation --config=configs/recirculation.py:cpu --workdir=runs/recirc
  python -m experiments.recirculation --config=configs/recirculation.py --workdir=runs/recirc_full \\
      --config.recirculation.sweep_schemes=ratio,nonconvex                # the full grid: an accelerator

Writes, in --workdir (a rerun with the same settings skips the cells already there):
  cells.jsonl                       one line per cell as it finishes
  results.json                      baseline, grid (best first on the selection windows), best cell
                                    (reported on the other windows, with its interval), controls,
                                    serial check, gain by position, settings, timings
  heatmap_<scheme>_alpha<alpha>.png  % perplexity change per (source, destination): blue lower, red higher
  heatmap_looping.png               the looping control over the same pairs
  gain_by_position.png              the best cell's change per position bucket
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from t2mlr_jax import cpu_runtime

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = f"--config={ROOT / 'configs' / 'recirculation.py'}:cpu"


def main_command(argv: list[str]) -> list[str]:
    """main.py's command line, with configs/recirculation.py:cpu when argv names no --config: --mode=train
    (the default) sweeps, --mode=eval scores config.recirculation's one pathway."""
    given = [arg for arg in argv[1:] if arg.startswith("--config=")]
    return [sys.executable, str(ROOT / "main.py"), *([] if given else [DEFAULT_CONFIG]), *argv[1:]]


if __name__ == "__main__":
    cpu_runtime.tune()  # as every program's first call (main.py, which this becomes, tunes again: a no-op)
    if any(arg in ("-h", "--help", "--helpfull") for arg in sys.argv[1:]):
        print(__doc__, flush=True)  # this sweep's outputs, then main.py's own --help: its flags
    command = main_command(sys.argv)
    os.execv(command[0], command)  # main.py itself, in this process: its exit status, its signals
