"""Side-by-side results of several architectures trained on one config: a summary JSON and a PNG of
exact match / token accuracy against the length bin (S5: the number of actions N). The lead host writes."""

from __future__ import annotations

import json
from pathlib import Path

from t2mlr_jax.analysis.plots import save, subplots
from t2mlr_jax.parallel.multihost import is_lead_host
from t2mlr_jax.storage.workdir import SUMMARY  # same name at the top of the workdir

PLOT = "accuracy_vs_length.png"


def write_comparison(
    workdir: Path, summaries: dict[str, dict], *, title: str, train_lengths: str = ""
) -> dict:
    """summaries: arch -> the summary `train` returned. Writes workdir/summary.json and the plot."""
    workdir = Path(workdir)
    table = {
        arch: {
            "num_params": s["num_params"],
            "steps": s["steps"],
            **{k: s["eval"][k] for k in ("loss", "token_accuracy", "exact_match") if k in s["eval"]},
            "by_length": s["eval"].get("by_length", {}),
        }
        for arch, s in summaries.items()
    }
    result = {"title": title, "runs": table}
    if not is_lead_host():
        return result
    (workdir / SUMMARY).write_text(json.dumps(result, indent=2, default=str))
    fig, axes = subplots(1, 2, figsize=(11, 4))
    for arch, row in table.items():
        bins = sorted(row["by_length"], key=int)
        if not bins:
            continue
        lengths = [int(n) for n in bins]
        label = f"{arch} ({row['num_params'] / 1e3:.0f}k params)"
        axes[0].plot(lengths, [row["by_length"][n]["exact_match"] for n in bins], marker="o", label=label)
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
