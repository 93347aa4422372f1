"""Side-by-side results of several architectures trained on one config: a summary JSON and a PNG of
exact match / token accuracy against the length bin (S5: the number of actions N). The lead host writes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from t2mlr_jax.analysis.plots import save, subplots
from t2mlr_jax.parallel.multihost import is_lead_host
from t2mlr_jax.storage.workdir import SUMMARY, write_atomic  # SUMMARY: same name atop the workdir

PLOT = "accuracy_vs_length.png"


METRICS = ("loss", "token_accuracy", "exact_match")


def _row(summary: dict) -> dict:
    e = summary["eval"]
    return {
        "num_params": summary["num_params"],
        "steps": summary["steps"],
        **{k: e[k] for k in METRICS if k in e},
        "by_length": e.get("by_length", {}),
    }


def _over_seeds(rows: dict[int, dict]) -> dict:
    """One architecture's runs at several seeds: each seed's figures, and the mean, standard deviation
    and range of each metric (per length bin, the mean and range)."""
    first = next(iter(rows.values()))
    spread = lambda values: {
        "mean": float(np.mean(values)),
        "std": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
        "min": float(np.min(values)),
        "max": float(np.max(values)),
    }
    bins = first["by_length"]
    return {
        "num_params": first["num_params"],
        "steps": first["steps"],
        **{k: float(np.mean([r[k] for r in rows.values()])) for k in METRICS if k in first},
        "spread": {k: spread([r[k] for r in rows.values()]) for k in METRICS if k in first},
        "by_length": {
            n: {k: float(np.mean([r["by_length"][n][k] for r in rows.values()])) for k in bins[n]}
            for n in bins
        },
        "by_length_range": {
            n: [
                min(r["by_length"][n]["exact_match"] for r in rows.values()),
                max(r["by_length"][n]["exact_match"] for r in rows.values()),
            ]
            for n in bins
        },  # fmt: skip
        "seeds": {str(seed): r for seed, r in rows.items()},
    }


def write_comparison(
    workdir: Path, summaries: dict[str, dict], *, title: str, train_lengths: str = ""
) -> dict:
    """summaries: run -> the summary `train` returned, a run being an architecture or "<arch>/seed<S>".
    Writes workdir/summary.json (per architecture; over its seeds, their mean and spread) and the plot
    (with seeds: the mean over them, the band their range)."""
    workdir = Path(workdir)
    by_arch: dict[str, dict] = {}
    for run, summary in summaries.items():
        arch, _, seed = run.partition("/seed")
        by_arch.setdefault(arch, {})[int(seed) if seed else None] = _row(summary)
    table = {arch: rows[None] if None in rows else _over_seeds(rows) for arch, rows in by_arch.items()}
    result = {"title": title, "runs": table}
    if not is_lead_host():
        return result
    write_atomic(workdir / SUMMARY, json.dumps(result, indent=2, default=str))
    fig, axes = subplots(1, 2, figsize=(11, 4))
    for arch, row in table.items():
        bins = sorted(row["by_length"], key=int)
        if not bins:
            continue
        lengths = [int(n) for n in bins]
        label = f"{arch} ({row['num_params'] / 1e3:.0f}k params)"
        (line,) = axes[0].plot(
            lengths, [row["by_length"][n]["exact_match"] for n in bins], marker="o", label=label
        )
        if "by_length_range" in row:
            low, high = zip(*(row["by_length_range"][n] for n in bins))
            axes[0].fill_between(lengths, low, high, color=line.get_color(), alpha=0.2)
        axes[1].plot(lengths, [row["by_length"][n]["token_accuracy"] for n in bins], marker="o", label=label)
    for ax, what in zip(axes, ("sequence exact match", "token accuracy")):
        ax.set_xlabel(
            "length bin (S5: number of actions N)"
            + (f"; trained on {train_lengths}" if train_lengths else "")
        )
        ax.set_ylabel(what)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    save(fig, workdir / PLOT)
    return result
