"""The recirculation sweep's figures: a heatmap of the % perplexity change per scheme and alpha, the
looping control's, and the best cell's change by position in the window."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from t2mlr_jax.analysis.plots import save, subplots

ANNOTATE_MAX = 200  # heatmaps with at most this many cells show each cell's %


def write_plots(workdir: Path, results: dict) -> None:
    """A heatmap per scheme and alpha, the looping control's heatmap, the best cell's gain by position."""
    grid = results["grid"]
    for scheme in results["settings"]["schemes"]:
        for alpha in results["settings"]["alphas"]:
            cells = [c for c in grid if c["scheme"] == scheme and c["alpha"] == alpha]
            _heatmap(
                workdir / f"heatmap_{scheme}_alpha{alpha:g}.png",
                cells,
                f"recirculation: {scheme}, α = {alpha:g}",
            )
    if "controls" in results:
        _heatmap(workdir / "heatmap_looping.png", results["controls"]["looping"]["cells"], "looping control")
    _gain_plot(workdir / "gain_by_position.png", results)


def _heatmap(path: Path, cells: list[dict], title: str) -> None:
    """% perplexity change, source block up, destination block across: blue lower, red higher."""
    from matplotlib import colormaps  # with the figure, not on import (plots.py)

    sources = sorted({c["source"] for c in cells})
    destinations = sorted({c["destination"] for c in cells})
    values = np.full((len(sources), len(destinations)), np.nan)
    for c in cells:
        values[sources.index(c["source"]), destinations.index(c["destination"])] = c["change_pct"]
    limit = max(float(np.nanmax(np.abs(values))), 1e-9)
    size = (max(5.0, 0.45 * len(destinations) + 3.0), max(3.5, 0.4 * len(sources) + 1.5))
    fig, ax = subplots(figsize=size)
    cmap = colormaps["RdBu_r"].with_extremes(bad="0.9")
    image = ax.imshow(values, cmap=cmap, vmin=-limit, vmax=limit, origin="lower", aspect="auto")
    ax.set_xticks(range(len(destinations)), destinations)
    ax.set_yticks(range(len(sources)), sources)
    ax.set_xlabel("destination block d")
    ax.set_ylabel("source block s")
    if values.size <= ANNOTATE_MAX:
        for (i, j), v in np.ndenumerate(values):
            if np.isfinite(v):
                color = "white" if abs(v) > 0.6 * limit else "black"
                ax.text(j, i, f"{v:+.2f}", ha="center", va="center", fontsize=7, color=color)
    fig.colorbar(image, ax=ax, label="% perplexity change vs unmodified")
    ax.set_title(title)
    save(fig, path)


def _gain_plot(path: Path, results: dict) -> None:
    gain, best = results["gain_by_position"], results["best"]
    fig, ax = subplots(figsize=(6, 3.5))
    ax.plot(gain["bucket_start"], gain["change_pct"], marker="o")
    ax.axhline(0.0, color="0.5", lw=0.8)
    ax.set_xlabel("position in the document (bucket start)")
    ax.set_ylabel("% perplexity change vs unmodified")
    ax.set_title(
        f"best cell: {best['scheme']} α={best['alpha']:g}, s={best['source']}, d={best['destination']}"
    )
    ax.grid(alpha=0.3)
    save(fig, path)
