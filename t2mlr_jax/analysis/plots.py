"""Figures written to files, as matplotlib `Figure` objects: no pyplot, so no display backend to choose
and nothing configured on import (savefig renders by the file's suffix). matplotlib loads with the first
figure, not with the modules that draw."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def subplots(
    nrows: int = 1, ncols: int = 1, *, figsize: tuple, layout: str | None = None, **kw: Any
) -> tuple[Any, Any]:
    """(figure, axes) as pyplot.subplots gives them; `kw` goes to Figure.subplots (squeeze, gridspec_kw)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout=layout)
    return fig, fig.subplots(nrows, ncols, **kw)


def save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def finish(ax: Any, title: str) -> None:
    """A panel against training steps: integer ticks, a light grid, a legend when something was drawn."""
    from matplotlib.ticker import MaxNLocator

    ax.set(title=title, xlabel="step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize="small")


def interval_rows(ax: Any, labels: list[str], intervals: list[dict], *, xlabel: str, title: str,
                  zero: bool = False) -> None:  # fmt: skip
    """One row per interval (a dict with mean, low, high: protocol.Interval's fields), top to bottom: the
    mean and its bar; `zero` draws the line a difference's interval is judged against."""
    for y, i in enumerate(intervals):
        ax.errorbar(i["mean"], y, xerr=[[i["mean"] - i["low"]], [i["high"] - i["mean"]]], fmt="o", capsize=3)
    if zero:
        ax.axvline(0, color="gray", lw=0.8)
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set(xlabel=xlabel, title=title)
    ax.grid(alpha=0.3)
