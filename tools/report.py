#!/usr/bin/env python
"""Summarize a main.py workdir without TensorBoard: report.md and report.json (how the run ended, the
run's config, final and best train / eval metrics, checkpoints with their sizes, steps and tokens per
second, the slowest ops of the steps train.profile traced), curves.png (loss, bits per byte for text
runs, accuracy vs step) and gates.png (T²MLR gate means and ReZero gammas vs step; skipped when the run
logs none). A multi-architecture workdir gets one section
and one line per run.

Examples:
  python tools/report.py runs/demo                   # both runs of the demo; writes runs/demo/report/
  python tools/report.py runs/s5 --out /tmp/s5-report

Each run's report leads with how it ended: finished, stopped at NaN (the non-finite step, its loss and
gradient norm), stopped by SIGTERM / SIGINT (resumable), killed, or still running, and how many times it
was resumed (from WORKDIR/sessions.jsonl; for older runs only a NaN stop shows, from metrics.jsonl). A
summary.json older than the last session's start is an earlier session's: it is ignored, and the report
says so.

Throughput comes from the `time` of each metrics.jsonl line; it is "unknown" for logs written before
lines carried one. Bad input (not a workdir, a malformed metrics.jsonl line) is one `error:` line on
stderr and exit status 2, with nothing written.
"""

from __future__ import annotations

import sys
from pathlib import Path

from t2mlr_jax import cpu_runtime
from t2mlr_jax.analysis.report import build_report, text_summary, write_report
from t2mlr_jax.analysis.run_logs import ReportError, load_runs
from t2mlr_jax.config.cli import OneLineParser


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(description=__doc__)
    parser.add_argument("workdir", type=Path, help="a main.py --workdir (one run, or one per sub-folder)")
    parser.add_argument("--out", type=Path, help="output folder (default: WORKDIR/report)")
    args = parser.parse_args(argv)
    try:
        runs = load_runs(args.workdir)
        report = build_report(args.workdir, runs)
    except ReportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = args.out or args.workdir / "report"
    written = write_report(out, report, runs)
    print(text_summary(report))
    if not report["files"]["gates"]:
        print("gates.png skipped: no gate/* or *gamma* metrics logged")
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    cpu_runtime.tune()
    sys.exit(main())
