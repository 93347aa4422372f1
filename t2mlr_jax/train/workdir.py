"""A run's workdir, in one place: the names main.py's writers give its files and which checkpoint steps
are finished. No JAX here, so readers such as tools/report.py start without it."""

from __future__ import annotations

from pathlib import Path

RUN_CONFIG = "run_config.json"  # the run's identity (checkpoint.check_workdir)
METRICS = "metrics.jsonl"  # metrics_log.MetricsLog
SUMMARY = "summary.json"  # trainer.train, compare.write_comparison
CHECKPOINTS = "checkpoints"  # orbax step folders, one per saved step
CORRUPT = "corrupt_checkpoints"  # step folders proven unreadable, set aside (checkpoint.Checkpointer)


def saved_steps(directory: Path | str) -> list[int]:
    """The finished checkpoints in a checkpoints/ folder (orbax renames a step folder to its bare number
    only once the save completed)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.is_dir() and p.name.isdigit())
