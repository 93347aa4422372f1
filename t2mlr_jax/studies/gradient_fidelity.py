"""Gradient fidelity of the Jacobi forward (the paper's Fig. 7, ../shared/papers/000 App. B.3): on a
trained checkpoint, the training gradient at each Jacobi setting (D = d_forward passes, gradient through
the last B = d_backward) against the anchor D = B = 32, per parameter group, averaged over a few eval
batches: cosine similarity, relative l2 distance ||g - g_ref|| / ||g_ref|| and norm ratio ||g|| / ||g_ref||.

Each gradient is the train step's own (t2mlr_jax.train.train_step.make_grad_fn: the architecture's
training forward, config.t2mlr.forward_mode = jacobi, with model.recurrence.d_forward / d_backward set
to the cell's D and B), on the checkpoint's weights read by config.init_from's loader. The grid is every
(D, B) of --d_forward x --d_backward (default: the preset's, GRIDS) with B <= D (the model refuses
B > D). Groups: the fusion parameters (`mixer`, the optimizer's gate group), the blocks before l_start,
inside [l_start, l_end] and after l_end (the stacked `layers` axis split), the embeddings / head / final
norm, and all parameters.

  python -m experiments.gradient_fidelity --preset=cpu            # trains its own S5 checkpoint first
  python -m experiments.gradient_fidelity --preset=cpu --checkpoint=runs/jacobi_vs_exact_cpu/jacobi
  python -m experiments.gradient_fidelity --preset=paper --checkpoint=runs/fw135/checkpoints/20000 \\
      --eval_path=data/fw-smollm2-eval                             # the paper's model (accelerators)

Without --checkpoint the preset's config is trained first, by the framework's trainer, into
<out>/checkpoint (resumable: a rerun reuses it). Writes, in --out (default runs/gradient_fidelity_<preset>):
  results.json  meta (command, checkpoint, batches, longest row), the groups, and per (D, B) cell the
                three measures per group (means over the batches) and the cell's wall seconds
  results.md    cosine / relative l2 distance and the norm ratio per cell and group; also printed
  results.png   heatmaps over (D, B): one column per group, one row per measure
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
from jaxtyping import Float

from t2mlr_jax.analysis.plots import subplots
from t2mlr_jax.config.cli import OneLineParser, fail
from t2mlr_jax.studies import runner
from t2mlr_jax.studies.analysis_common import (
    Preset,
    add_checkpoint_flag,
    add_config_flags,
    checkpoint_params,
    given_or_trained,
    preset_config,
    setup_jax,
)
from t2mlr_jax.studies.benchmarks.report import environment, markdown_table

COMMAND = "python -m experiments.gradient_fidelity"
PRESETS = {
    "cpu": Preset(
        "configs/s5_retrieval_t2mlr.py:cpu",
        {
            "eval.batch_size": 64,
            # rows of N = 14..20 actions (33-45 tokens): longer than every D of the grid and the anchor's 32,
            # so that no cell is trivially the exact forward (training's N <= 6 rows are <= 17 tokens)
            "data.eval_options.min_actions": 14,
            "data.eval_options.max_actions": 20,
            "eval.window": 84,  # room for the longest possible N = 20 row
        },
        "S5-retrieval's cpu preset (parity, 64 x 4, l_start 1), trained its 800 steps (the gate opens at "
        "step 250-400) unless --checkpoint is given; gradients on eval batches of 64 rows of 33-45 tokens",
    ),
    "paper": Preset(
        "configs/smollm135m_t2mlr.py",
        {},
        "the paper's FineWeb-Edu SmolLM2-135M T²MLR, window (5,26), trained elsewhere",
        ("checkpoint", "eval_path"),
    ),
}
# The (D, B) grid of each preset: the cpu one is thinner in B, as each cell compiles once (~10-20 s here).
GRIDS = {
    "cpu": ((1, 2, 4, 8, 16, 32), (1, 4, 16)),
    "paper": ((1, 2, 4, 8, 16, 32), (1, 2, 4, 8, 16, 32)),
}
MEASURES = {  # key -> label
    "cosine": "cosine similarity",
    "rel_l2": "relative l2 distance",
    "norm_ratio": "norm ratio ||g|| / ||g_ref||",
}


def positive_ints(text: str) -> tuple[int, ...]:
    """A comma list of integers >= 1 (argparse type): Jacobi depths."""
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = OneLineParser(prog=COMMAND, description=__doc__)
    add_config_flags(parser, PRESETS, "gradient_fidelity")
    add_checkpoint_flag(parser)
    parser.add_argument("--d_forward", type=positive_ints, help="D values (default: the preset's, GRIDS)")
    parser.add_argument("--d_backward", type=positive_ints, help="B values (default: the preset's, GRIDS)")
    parser.add_argument("--reference", type=positive_ints, default=(32, 32), help="the anchor's D,B")
    parser.add_argument("--batches", type=int, default=4, help="eval batches the measures are averaged over")
    return parser.parse_args(argv)


def grid(d_forwards, d_backwards, reference) -> list[tuple[int, int]]:
    """The anchor first, then every (D, B) with B <= D, D-major."""
    if len(reference) != 2 or reference[1] > reference[0]:
        raise ValueError(f"--reference must be D,B with B <= D, got {','.join(map(str, reference))}")
    cells = [(d, b) for d in sorted(set(d_forwards)) for b in sorted(set(d_backwards)) if b <= d]
    if not cells:
        raise ValueError("no (D, B) cell with B <= D: the model refuses B > D")
    reference = tuple(reference)
    return [reference, *(c for c in cells if c != reference)]


# ---------------------------------------------------------------------------------------------- measuring


def jacobi_config(config, d_forward: int, d_backward: int):
    """`config` training with the Jacobi forward at D = d_forward, B = d_backward."""
    config = config.copy_and_resolve_references()
    config.model.recurrence.d_forward, config.model.recurrence.d_backward = d_forward, d_backward
    config.t2mlr.forward_mode, config.t2mlr.d_forward_values = "jacobi", ""
    return config


def parameter_groups(arch) -> dict[str, tuple[str, list[tuple[int, slice]]]]:
    """name -> (description, pieces): each piece a leaf index (in the params' flattening order) and the
    rows of its leading axis that belong to the group. Read off the parameter table: a leaf whose first
    logical axis is `layers` is split at l_start and l_end; the `mixer` subtree is the fusion."""
    import jax

    from t2mlr_jax.model.spec import is_spec
    from t2mlr_jax.train.optimizer import GATE_GROUP

    (l_start, l_end), n = arch.backbone.layer_range, arch.backbone.num_layers
    spans = {
        "before": ("before l_start", slice(0, l_start)),
        "window": ("the recurrent window", slice(l_start, l_end + 1)),
        "after": ("after l_end", slice(l_end + 1, n)),
    }
    spans = {  # l_start = 0 or l_end = L - 1 leaves a group without blocks
        k: (f"blocks {rows.start}..{rows.stop - 1} ({about})", rows)
        for k, (about, rows) in spans.items()
        if rows.start < rows.stop
    }
    groups = {"mixer": [], **{k: [] for k in spans}, "embed_head": [], "all": []}
    sizes = dict.fromkeys(groups, 0)
    leaves, _ = jax.tree_util.tree_flatten_with_path(arch.specs, is_leaf=is_spec)
    for i, (path, spec) in enumerate(leaves):
        size = math.prod(spec.shape)
        groups["all"].append((i, slice(None)))
        sizes["all"] += size
        if path[0].key == GATE_GROUP:
            groups["mixer"].append((i, slice(None)))
            sizes["mixer"] += size
        elif spec.axes[:1] == ("layers",):
            for name, (_, rows) in spans.items():
                groups[name].append((i, rows))
                sizes[name] += size // spec.shape[0] * (rows.stop - rows.start)
        else:
            groups["embed_head"].append((i, slice(None)))
            sizes["embed_head"] += size
    about = {
        "mixer": "the fusion parameters (params['mixer'], the optimizer's gate group)",
        **{k: v[0] for k, v in spans.items()},
        "embed_head": "embeddings, head and final norm (everything outside the layer stack and the mixer)",
        "all": "every parameter",
    }
    return {
        name: (f"{about[name]}: {sizes[name]:,} parameter" + "s" * (sizes[name] != 1), pieces)
        for name, pieces in groups.items()
        if pieces
    }


def compare(
    grads: list[Float[np.ndarray, "*_dims"]],
    reference: list[Float[np.ndarray, "*_dims"]],
    groups: dict[str, tuple[str, list[tuple[int, slice]]]],
) -> dict[str, dict[str, float]]:
    """Per group: cosine, ||g - r|| / ||r|| and ||g|| / ||r|| of two gradients (leaves in the same order),
    in float64."""
    result = {}
    for name, (_, pieces) in groups.items():
        dot = gg = rr = dd = 0.0
        for leaf, rows in pieces:
            g = np.asarray(grads[leaf][rows], np.float64).ravel()
            r = np.asarray(reference[leaf][rows], np.float64).ravel()
            dot, gg, rr, dd = dot + g @ r, gg + g @ g, rr + r @ r, dd + (g - r) @ (g - r)
        denominator = math.sqrt(gg * rr)
        result[name] = {
            "cosine": dot / denominator if denominator else math.nan,
            "rel_l2": math.sqrt(dd / rr) if rr else math.nan,
            "norm_ratio": math.sqrt(gg / rr) if rr else math.nan,
        }
    return result


def measure(config, params: dict, batches: list[dict], cells: list[tuple[int, int]]) -> dict:
    """The gradient of every (D, B) cell on each batch against the first cell's (the anchor), per group,
    averaged over the batches: {"reference": [D, B], "groups": name -> description, "cells": [...]}."""
    import jax

    from t2mlr_jax.architectures import build_architecture
    from t2mlr_jax.experiment import resolve
    from t2mlr_jax.train.train_step import make_grad_fn

    rng = jax.random.PRNGKey(0)
    anchor = {}  # the first cell's gradients, and the parameter groups

    def measure_cell(d_forward: int, d_backward: int) -> dict:
        started = time.time()
        arch = build_architecture(resolve(jacobi_config(config, d_forward, d_backward)))
        grad_fn = jax.jit(make_grad_fn(arch))
        grads = [
            jax.tree.leaves(jax.device_get(grad_fn(params, batch, arch.init_model_state(), rng)[0]))
            for batch in batches
        ]
        if not anchor:
            anchor.update(grads=grads, groups=parameter_groups(arch))
        per_batch = [compare(g, r, anchor["groups"]) for g, r in zip(grads, anchor["grads"])]
        return {
            "d_forward": d_forward,
            "d_backward": d_backward,
            "groups": {
                name: {m: float(np.mean([b[name][m] for b in per_batch])) for m in MEASURES}
                for name in anchor["groups"]
            },
            "seconds": round(time.time() - started, 2),
        }

    # a table of the study runner: the cells × one repeat, nothing journaled (one process, one checkpoint)
    study = runner.Study(runner.grid(cells), lambda cell, _: measure_cell(*cell), desc="(D, B) cells")
    measured = runner.by_row(runner.run(study).results)
    return {
        "reference": list(cells[0]),
        "groups": {name: about for name, (about, _) in anchor["groups"].items()},
        "cells": list(measured.values()),
    }


def eval_batches(config, count: int) -> list[dict]:
    """The first `count` eval batches, as the train step consumes them."""
    import itertools

    from t2mlr_jax.experiment import resolve
    from t2mlr_jax.train.build_data import build_data_source
    from t2mlr_jax.train.train_step import model_inputs

    batches = build_data_source(resolve(config), train=False).eval_batches()
    batches = [model_inputs(b) for b in itertools.islice(batches, count)]
    if not batches:
        raise ValueError("the eval set gave no batch")
    return batches


# ---------------------------------------------------------------------------------------------- report


def _value(values: dict, measure: str) -> str:
    return "—" if not math.isfinite(values[measure]) else f"{values[measure]:.4f}"


def _cosine_and_distance(values: dict) -> str:
    return f"{_value(values, 'cosine')} / {_value(values, 'rel_l2')}"


def render(meta: dict, result: dict) -> str:
    groups = list(result["groups"])
    reference = "(D, B) = ({}, {})".format(*result["reference"])
    rows = [
        [c["d_forward"], c["d_backward"], *(_cosine_and_distance(c["groups"][g]) for g in groups)]
        for c in result["cells"]
    ]
    ratios = [
        [c["d_forward"], c["d_backward"], *(_value(c["groups"][g], "norm_ratio") for g in groups)]
        for c in result["cells"]
    ]
    return (
        "\n".join(
            [
                f"# Gradient fidelity of the Jacobi forward against {reference} ({meta['preset']})",
                "",
                f"`{meta['command']}` on {meta['device']}, jax {meta['jax']}; wall time "
                f"{meta['wall_seconds']:.0f} s (this invocation). Checkpoint `{meta['checkpoint']}`; "
                f"{meta['batches']} eval batches of {meta['rows_per_batch']} rows, the longest "
                f"{meta['longest_row']} tokens (D >= {meta['longest_row']} runs the exact forward).",
                "",
                "## Cosine similarity / relative l2 distance to the anchor, per parameter group",
                "",
                markdown_table(["D", "B", *groups], rows),
                "",
                "## Norm ratio ||g|| / ||g_ref||",
                "",
                markdown_table(["D", "B", *groups], ratios),
                "",
                *(f"- `{g}`: {about}" for g, about in result["groups"].items()),
                "- Each measure is the mean over the batches; the gradient is of the summed training loss.",
            ]
        )
        + "\n"
    )


def _color_scale(measure: str, lowest: float):
    """(colormap, normalisation, colorbar ticks) of a measure, the same for every group. The distances and
    ratios are clipped (a D = 1 cell can be 20x off): the printed values are exact."""
    from matplotlib.colors import LogNorm, Normalize

    if measure == "cosine":
        return "viridis", Normalize(min(lowest, 0.9), 1.0), None
    if measure == "rel_l2":
        return "viridis_r", Normalize(0.0, 2.0), None  # yellow = close, as the cosine's
    return "coolwarm", LogNorm(0.25, 4.0), [0.25, 0.5, 1, 2, 4]  # norm ratio: 1 in the middle


def plot(result: dict, path: Path) -> None:
    groups, cells = list(result["groups"]), result["cells"]
    ds = sorted({c["d_forward"] for c in cells})
    bs = sorted({c["d_backward"] for c in cells})
    fig, axes = subplots(
        len(MEASURES),
        len(groups),
        figsize=(2.3 * len(groups) + 1.5, 2.3 * len(MEASURES) + 0.5),
        squeeze=False,
        layout="constrained",
    )
    for row, (measure, label) in enumerate(MEASURES.items()):
        grids = {}
        for g in groups:
            grids[g] = np.full((len(bs), len(ds)), np.nan)  # NaN: B > D, not a cell
            for c in cells:
                grids[g][bs.index(c["d_backward"]), ds.index(c["d_forward"])] = c["groups"][g][measure]
        lowest = np.nanmin([np.nanmin(v) if np.isfinite(v).any() else 1.0 for v in grids.values()])
        cmap, norm, ticks = _color_scale(measure, float(lowest))
        for col, g in enumerate(groups):
            ax = axes[row, col]
            image = ax.imshow(grids[g], origin="lower", cmap=cmap, norm=norm, aspect="auto")
            for (y, x), value in np.ndenumerate(grids[g]):
                if np.isfinite(value):
                    ax.text(x, y, f"{value:.2f}", ha="center", va="center", fontsize=6,
                            bbox=dict(facecolor="white", alpha=0.6, linewidth=0, pad=0.5))  # fmt: skip
            ax.set_xticks(range(len(ds)), ds, fontsize=7)
            ax.set_yticks(range(len(bs)), bs, fontsize=7)
            ax.set_xlabel("D", fontsize=8)
            if col == 0:
                ax.set_ylabel(f"{label}\nB", fontsize=8)
            if row == 0:
                ax.set_title(g, fontsize=9)
        fig.colorbar(image, ax=axes[row].tolist(), shrink=0.9, ticks=ticks, format="%g").minorticks_off()
    fig.suptitle("Jacobi (D, B) gradients against D = {}, B = {}".format(*result["reference"]))
    fig.savefig(path, dpi=120)


def write_results(out: Path, meta: dict, result: dict) -> str:
    from t2mlr_jax.train.metrics_log import json_safe

    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(json_safe({"meta": meta, **result}), indent=1))
    markdown = render(meta, result)
    (out / "results.md").write_text(markdown)
    plot(result, out / "results.png")
    return markdown


# ---------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    out = Path(args.out or f"runs/gradient_fidelity_{args.preset}")
    started = time.time()
    try:  # everything checked before anything is compiled
        config = preset_config(PRESETS[args.preset], args)
        d_forwards, d_backwards = GRIDS[args.preset]
        cells = grid(args.d_forward or d_forwards, args.d_backward or d_backwards, args.reference)
        if args.batches < 1:
            raise ValueError(f"--batches must be >= 1, got {args.batches}")
        checkpoint, loader = given_or_trained(config, args.checkpoint, out)
        batches = eval_batches(config, args.batches)
    except (ValueError, KeyError, FileNotFoundError) as e:
        fail(e)
    setup_jax(out)
    params = checkpoint_params(config, checkpoint, loader)
    if params is None:
        return {}
    result = measure(config, params, batches, cells)
    meta = {
        **environment(args.preset, COMMAND, argv),
        "checkpoint": str(checkpoint),
        "batches": len(batches),
        "rows_per_batch": int(batches[0]["tokens"].shape[0]),
        "longest_row": int(max((b["segment_ids"] > 0).sum(axis=1).max() for b in batches)),
        "wall_seconds": round(time.time() - started, 1),
    }
    markdown = write_results(out, meta, result)
    print(markdown)
    return {"meta": meta, **result}
