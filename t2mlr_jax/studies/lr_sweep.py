"""The learning-rate rule (t2mlr_jax.studies.recipe_rule): sweep one multiplier over all of a recipe's
rates (optimizer.lr_multiplier) on a study's baseline row only, on seeds no comparison uses, and choose the
multiplier with the best mean held-out metric (never one at which a seed diverged). The chosen multiplier
is then written into the study's config by hand, with this command's table in docs/recipes.md, and used
unchanged for every row.

  python -m experiments.lr_sweep --config=configs/s5_retrieval_t2mlr.py:demo --set=arch=transformer \\
      --multipliers=0.25,0.5,1,2,4 --seeds=100,101 --metric=loss --out=runs/lr_sweep/s5_demo

Each (multiplier, seed) trains into <out>/x<multiplier>/seed<s>/ (a finished one is read back, a stopped
one resumes); --workers runs them in that many processes (each this command with --shard=I/N). Writes, in
--out: sweep.jsonl (one line per cell as it finishes), sweep.json (the cells, each multiplier's mean,
diverged runs, the choice, the rule, the commit), sweep.md (also printed), sweep.png (metric vs
multiplier).
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from pathlib import Path

from t2mlr_jax.analysis.plots import save, subplots
from t2mlr_jax.analysis.run_logs import HIGHER_IS_BETTER, LOWER_IS_BETTER, metric_trajectory
from t2mlr_jax.config.cli import OneLineParser, fail
from t2mlr_jax.config.edit import config_module, set_path
from t2mlr_jax.storage.workdir import SUMMARY
from t2mlr_jax.studies import ROOT, runner
from t2mlr_jax.studies.analysis_common import (
    check_run,
    comma_list,
    pretokenize,
    setup_jax,
    study_tokenizer,
    train_run,
)
from t2mlr_jax.studies.preregistration import commit, recipe
from t2mlr_jax.studies.recipe_rule import (
    AFTER_STEP,
    SWEEP_SEEDS,
    choose_multiplier,
    count_diverged,
    diverged,
    sweep_means,
)
from t2mlr_jax.train.local_workers import parse_shard, shard_of

COMMAND = "python -m experiments.lr_sweep"


def _multipliers(text: str) -> tuple[float, ...]:
    values = comma_list(text, float)
    if not values or any(not v > 0 for v in values) or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"--multipliers needs distinct values > 0, got {text!r}")
    return tuple(sorted(values))


def _setting(text: str) -> tuple[str, object]:
    path, eq, value = text.partition("=")
    if not eq or not path:
        raise ValueError(f"--set takes <dotted.path>=<value>, got {text!r}")
    try:
        return path, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return path, value


def parse_args(argv: list[str]):
    parser = OneLineParser(prog=COMMAND, description=__doc__)
    parser.add_argument("--config", required=True, help="the baseline row: <config file>[:presets]")
    parser.add_argument("--set", action="append", default=[], help="<dotted.path>=<value> (repeatable)")
    parser.add_argument(
        "--multipliers",
        type=_multipliers,
        default=(0.25, 0.5, 1.0, 2.0, 4.0),
        help="the grid of lr multipliers",
    )
    parser.add_argument(
        "--seeds", type=comma_list, default=SWEEP_SEEDS, help="sweep seeds (none a comparison reports)"
    )
    parser.add_argument("--metric", default="loss", help="the summary's eval metric the rule compares")
    parser.add_argument(
        "--study_vocab",
        type=int,
        default=0,
        help="> 0: train on the studies' byte-level BPE of this many tokens (trained on the training plays "
        "into <out>/tokenizer, as the studies do), the text as token stores in <out>/data",
    )
    parser.add_argument("--workers", type=int, default=1, help="processes training cells side by side")
    parser.add_argument("--shard", help="I/N: train only every N-th cell from the I-th, tabulate nothing")
    parser.add_argument("--out", required=True, help="output directory")
    args = parser.parse_args(argv)
    try:
        args.set = [_setting(s) for s in args.set]
        args.shard = parse_shard(args.shard) if args.shard else None
        if not args.seeds:
            raise ValueError("--seeds is empty")
        if args.workers < 1:
            raise ValueError(f"--workers must be at least 1, got {args.workers}")
        if args.metric not in LOWER_IS_BETTER + HIGHER_IS_BETTER:
            raise ValueError(
                f"--metric must be one of {LOWER_IS_BETTER + HIGHER_IS_BETTER}, got {args.metric!r}"
            )
    except ValueError as e:
        fail(e)
    return args


def baseline_config(args):
    """The baseline row as --config, --set and --study_vocab make it (its tokenizer and token stores
    prepared once); every cell is a copy."""
    path, _, presets = args.config.partition(":")
    config = config_module(ROOT / path).get_config(presets or None)
    for dotted, value in args.set:
        set_path(config, dotted, value)
    if args.study_vocab:
        config.data.tokenizer = study_tokenizer(Path(args.out), args.study_vocab)
        pretokenize(config, Path(args.out) / "data")
    return config


def cell_config(baseline, multiplier: float, seed: int):
    config = baseline.copy_and_resolve_references()
    config.optimizer.lr_multiplier = multiplier
    config.seed = seed
    return config


def cell_dir(out: Path, multiplier: float, seed: int) -> Path:
    return out / f"x{multiplier:g}" / f"seed{seed}"


def cell_result(config, workdir: Path, metric: str) -> dict:
    """Train (or read back) one cell: its metric, and whether its training loss diverged."""
    from t2mlr_jax.experiment import resolve

    summary = train_run(config, workdir)
    if "stopped_by" in summary:
        return summary
    return {
        "metric": summary["eval"][metric],
        "diverged": diverged(metric_trajectory(workdir, "train", "loss"), resolve(config).model.vocab_size),
        "steps": summary["steps"],
    }


def render(meta: dict, cells: dict, means: dict, chosen: float) -> str:
    seeds = meta["seeds"]
    lines = [
        f"# LR sweep: `{meta['command']}`",
        "",
        f"Baseline row `{meta['config']}` {meta['set'] or ''}; base rates {meta['base_rates']}; seeds "
        f"{', '.join(map(str, seeds))}; held-out {meta['metric']} "
        f"({'lower' if meta['lower_is_better'] else 'higher'} is better); commit `{meta['commit']}`.",
        "",
        "| multiplier | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | |",
        "|---|" + "---|" * len(seeds) + "---|---|",
    ]
    for m in sorted(cells):
        marks = ["diverged" if cells[m][s]["diverged"] else "" for s in seeds]
        values = [f"{cells[m][s]['metric']:.4f}{' (diverged)' if d else ''}" for s, d in zip(seeds, marks)]
        lines.append(
            f"| ×{m:g} | "
            + " | ".join(values)
            + f" | {means[m]:.4f} | {'**chosen**' if m == chosen else ''} |"
        )
    d = meta["diverged"]
    lines += ["", f"Diverged runs (loss > ln V after step {AFTER_STEP}): {d['diverged']} of {d['of']}.", ""]
    return "\n".join(lines)


def plot(cells: dict, means: dict, chosen: float, meta: dict, path: Path) -> None:
    fig, ax = subplots(figsize=(5.5, 4))
    for seed in meta["seeds"]:
        ax.plot(
            sorted(cells),
            [cells[m][seed]["metric"] for m in sorted(cells)],
            "o:",
            lw=0.8,
            label=f"seed {seed}",
        )
    ax.plot(sorted(means), [means[m] for m in sorted(means)], "s-", color="black", label="mean")
    ax.axvline(chosen, color="gray", ls="--", lw=0.8)
    ax.set(xscale="log", xlabel="lr multiplier", ylabel=meta["metric"], title="LR sweep on the baseline row")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    save(fig, path)


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    out = Path(args.out)
    units = [(m, s) for m in args.multipliers for s in args.seeds]
    try:  # every cell's config built and checked before anything compiles
        out.mkdir(parents=True, exist_ok=True)
        baseline = baseline_config(args)
        for m, s in shard_of(units, args.shard):
            check_run(cell_config(baseline, m, s), cell_dir(out, m, s))
    except (ValueError, KeyError, TypeError, FileNotFoundError, subprocess.CalledProcessError) as e:
        fail(e)
    setup_jax(out)
    workers = 1 if args.shard else min(args.workers, len(units))
    dirs = [cell_dir(out, m, s) for m, s in units]
    if workers > 1 and not runner.run_shards("experiments.lr_sweep", argv, workers, out, dirs):
        return {}

    def run_cell(m: float, s: int) -> runner.Ran:
        fresh = not (cell_dir(out, m, s) / SUMMARY).exists()
        return runner.Ran(cell_result(cell_config(baseline, m, s), cell_dir(out, m, s), args.metric), fresh)

    study = runner.Study(
        shard_of(units, args.shard),
        run_cell,
        out / "sweep.jsonl",
        line=lambda m, s, seconds, result: {"multiplier": m, "seed": s, **result},
        tag=lambda m, s: "",
        desc="lr sweep cells",
    )
    cells, _, stopped = runner.run(study)
    if stopped or args.shard:
        return {}
    lower = args.metric in LOWER_IS_BETTER
    values = runner.values(cells, lambda r: r["metric"])
    bad = {f"x{m:g}/seed{s}": r["diverged"] for m, by_seed in cells.items() for s, r in by_seed.items()}
    chosen = choose_multiplier(
        values, lower, diverged_cells=[m for m in cells if any(r["diverged"] for r in cells[m].values())]
    )
    from t2mlr_jax.config.convert import to_dict
    from t2mlr_jax.experiment import resolve

    base = recipe(to_dict(resolve(baseline)))["optimizer"]
    rates = {"lr": base["lr"]} | (
        {k: v for k, v in base["muon"].items() if k.endswith("_lr")} if base["name"] == "muon" else {}
    )
    meta = {
        "command": " ".join([COMMAND, *argv]),
        "config": args.config,
        "set": dict(args.set),
        "seeds": list(args.seeds),
        "metric": args.metric,
        "lower_is_better": lower,
        "base_rates": rates,
        "commit": commit(),
        "diverged": count_diverged(bad),
    }
    means = sweep_means(values)
    payload = {"meta": meta, "cells": {f"{m:g}": by_seed for m, by_seed in cells.items()},
               "means": {f"{m:g}": v for m, v in means.items()}, "chosen": chosen}  # fmt: skip
    runner.write_json(out / "sweep.json", payload)
    text = render(meta, cells, means, chosen)
    (out / "sweep.md").write_text(text)
    plot(cells, means, chosen, meta, out / "sweep.png")
    print(text + f"chosen multiplier: {chosen:g}")
    return payload
