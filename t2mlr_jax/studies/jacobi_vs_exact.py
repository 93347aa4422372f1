"""Jacobi-trained versus exact-trained T²MLR (the paper's Table 6, ../shared/papers/000 App. B.4): the same
config trained twice by the framework's own trainer, once with the Jacobi forward (D = d_forward passes,
gradient through the last B = d_backward) and once with exact sequential recurrence and truncated
backpropagation through time over the same B links (config.t2mlr.forward_mode = jacobi / exact,
t2mlr.bptt = B); then each evaluated with both the exact and the Jacobi forward (t2mlr.eval_mode): a 2 x 2
table of eval loss (perplexity), with the wall time per training step of each.

  python -m experiments.jacobi_vs_exact --preset=cpu                     # S5 parity, D8 B4, ~minutes
  python -m experiments.jacobi_vs_exact --preset=cpu --d_forward=16 --d_backward=4
  python -m experiments.jacobi_vs_exact --preset=paper --train_path=data/fw-smollm2 \\
      --eval_path=data/fw-smollm2-eval                          # the paper's 135M run (accelerators)

Resumable: each row trains into <out>/<row>/ (jacobi, exact); a rerun skips a row whose summary.json
exists and resumes one stopped mid-training from its checkpoints (the trainer does). The evaluation with
the config's t2mlr.eval_mode (exact) is the trainer's final one (summary.json); the other is kept in
<out>/<row>/eval_<mode>.json. Writes, in --out (default runs/jacobi_vs_exact_<preset>):
  results.json  meta (command, D, B, longest eval row) and per row: eval metrics under each forward,
                steps, median wall seconds per training step, the row's seconds in this invocation
  results.md    the 2 x 2 table and the differences; also printed
  results.png   eval loss per (training, evaluation) pair, and seconds per training step
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

from t2mlr_jax.analysis.plots import subplots
from t2mlr_jax.config.cli import OneLineParser, fail
from t2mlr_jax.studies import runner
from t2mlr_jax.studies.analysis_common import (
    Preset,
    add_config_flags,
    check_run,
    preset_config,
    setup_jax,
    train_run,
)
from t2mlr_jax.studies.benchmarks.report import environment, markdown_table

COMMAND = "python -m experiments.jacobi_vs_exact"
PRESETS = {
    "cpu": Preset(
        "configs/s5_retrieval_t2mlr.py:cpu",
        {"model.recurrence.d_forward": 8, "model.recurrence.d_backward": 4, "train.steps": 200},
        "S5-retrieval's cpu preset (parity, 64 x 4, l_start 1; train rows of up to 17 tokens, eval up to 25) "
        "with D 8, B 4, 200 steps per row",
    ),
    "paper": Preset(
        "configs/smollm135m_t2mlr.py",
        # Table 6: paper l_start 8 (1-based; the release's symmetric l_end), the first 1B tokens, D16 B4.
        {"model.recurrence.l_start": 7, "model.recurrence.l_end": 22, "train.steps": 10**9 // (256 * 2048)},
        "the paper's SmolLM2-135M on the first 1B FineWeb-Edu tokens, l_start 8, D16 B4 (accelerators)",
        ("train_path", "eval_path"),
    ),
}
MODES = ("exact", "jacobi")  # rows (training forward) and columns (evaluation forward)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = OneLineParser(prog=COMMAND, description=__doc__)
    add_config_flags(parser, PRESETS, "jacobi_vs_exact")
    parser.add_argument("--d_forward", type=int, help="D (default: the preset's)")
    parser.add_argument("--d_backward", type=int, help="B, also the exact row's BPTT truncation")
    return parser.parse_args(argv)


def row_configs(config) -> dict:
    """mode -> `config` trained with that forward: Jacobi at the model's (D, B), or exact with truncated
    BPTT over the same B links."""
    rec = config.model.recurrence
    if not 1 <= rec.d_backward <= rec.d_forward:  # t2mlr.bptt = 0 would be full BPTT, not B = 0
        raise ValueError(
            f"need 1 <= B <= D (d_backward, d_forward), got B = {rec.d_backward}, D = {rec.d_forward}"
        )
    configs = {}
    for mode in MODES:
        row = config.copy_and_resolve_references()
        row.t2mlr.forward_mode, row.t2mlr.d_forward_values = mode, ""
        row.t2mlr.bptt = rec.d_backward if mode == "exact" else 0
        configs[mode] = row
    return configs


def seconds_per_step(workdir: Path) -> float | None:
    """Median wall seconds per training step between consecutive logged windows (metrics.jsonl); the
    median leaves out the first window's compilation and a resumed session's."""
    from t2mlr_jax.storage.workdir import METRICS

    records = [json.loads(line) for line in (workdir / METRICS).read_text().splitlines() if line.strip()]
    train = [r for r in records if r.get("split") == "train" and "time" in r]
    rates = [(b["time"] - a["time"]) / (b["step"] - a["step"]) for a, b in zip(train, train[1:])]
    return statistics.median(rates) if rates else None


def evaluate_as(config, workdir: Path, mode: str) -> dict:
    """The trained weights of `workdir` evaluated with the `mode` forward (t2mlr.eval_mode)."""
    from t2mlr_jax.experiment import resolve
    from t2mlr_jax.train.build_data import build_data_source
    from t2mlr_jax.train.trainer import Run, restore_state, run_eval

    config = config.copy_and_resolve_references()
    config.t2mlr.eval_mode = mode
    typed = resolve(config)
    run = Run(typed, workdir, build_data_source(typed, train=False), config.arch)
    state, _ = restore_state(run)
    return run_eval(run, state.params, state.model_state)


def run_row(mode: str, config, out: Path) -> dict:
    """Train (or resume, or skip) one row and evaluate it with both forwards: its result, or
    {"stopped_by": ...} when a signal stopped its training."""
    workdir = out / mode
    started = time.time()
    summary = train_run(config, workdir)
    if "stopped_by" in summary:
        return summary
    evals = {config.t2mlr.eval_mode: summary["eval"]}  # the trainer's final evaluation
    for eval_mode in (m for m in MODES if m not in evals):
        path = workdir / f"eval_{eval_mode}.json"
        if not path.exists():
            path.write_text(json.dumps(evaluate_as(config, workdir, eval_mode), indent=2, default=str))
        evals[eval_mode] = json.loads(path.read_text())
    return {
        "training": mode,
        "d_forward": config.model.recurrence.d_forward,
        "d_backward": config.model.recurrence.d_backward,
        "params": summary["num_params"],
        "steps": summary["steps"],
        "seconds_per_step": seconds_per_step(workdir),
        "eval": {m: {k: v for k, v in e.items() if k != "by_length"} for m, e in evals.items()},
        "row_seconds": round(time.time() - started, 1),
    }


# ---------------------------------------------------------------------------------------------- report


def _loss(metrics: dict) -> str:
    loss = metrics["loss"]
    return "—" if not math.isfinite(loss) else f"{loss:.4f} ({metrics['perplexity']:.3f})"


def row_label(row: dict) -> str:
    if row["training"] == "jacobi":
        return f"Jacobi train (D={row['d_forward']}, B={row['d_backward']})"
    return f"exact train (truncated BPTT, B={row['d_backward']})"


def render(meta: dict, rows: dict) -> str:
    d = meta["d_forward"]
    header = [
        "Training",
        "Exact eval: loss (ppl)",
        f"Jacobi eval (D={d}): loss (ppl)",
        "Jacobi − exact eval",
        "Token accuracy (exact / Jacobi eval)",
        "s / step",
        "Steps",
    ]
    table = []
    for mode in MODES:
        if mode not in rows:
            continue
        r, e = rows[mode], rows[mode]["eval"]
        table.append(
            [
                row_label(r),
                _loss(e["exact"]),
                _loss(e["jacobi"]),
                f"{e['jacobi']['loss'] - e['exact']['loss']:+.4f}",
                f"{e['exact']['token_accuracy']:.3f} / {e['jacobi']['token_accuracy']:.3f}",
                "—" if r["seconds_per_step"] is None else f"{r['seconds_per_step']:.3f}",
                r["steps"],
            ]
        )
    parts = [
        f"# Jacobi-trained vs exact-trained T²MLR ({meta['preset']})",
        "",
        f"`{meta['command']}` on {meta['device']}, jax {meta['jax']}; wall time {meta['wall_seconds']:.0f} s "
        f"(this invocation). Seed {meta['seed']}; eval rows of up to {meta['longest_eval_row']} tokens "
        f"(the Jacobi forward is exact at positions < D = {d}).",
        "",
        markdown_table(header, table),
    ]
    if len(rows) == len(MODES):
        gap = rows["jacobi"]["eval"]["exact"]["loss"] - rows["exact"]["eval"]["exact"]["loss"]
        parts += ["", f"- Jacobi-trained − exact-trained, both with the exact eval: {gap:+.4f} loss."]
    parts.append(
        "- s / step: the median wall seconds per training step between logged windows (compilation left out)."
    )
    return "\n".join(parts) + "\n"


def plot(meta: dict, rows: dict, path: Path) -> None:
    trained = [m for m in MODES if m in rows]
    fig, (left, right) = subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [2, 1]})
    width = 0.38
    for i, eval_mode in enumerate(MODES):
        losses = [rows[m]["eval"][eval_mode]["loss"] for m in trained]
        bars = left.bar(
            [x + (i - 0.5) * width for x in range(len(trained))], losses, width, label=f"{eval_mode} eval"
        )
        left.bar_label(bars, fmt="%.4f", fontsize=8)
    left.set_xticks(range(len(trained)), [row_label(rows[m]) for m in trained], fontsize=8)
    left.set(
        ylabel="eval loss", title=f"Eval loss by training and evaluation forward (D={meta['d_forward']})"
    )
    left.legend(fontsize=8)
    steps = [rows[m]["seconds_per_step"] or 0.0 for m in trained]
    right.bar(range(len(trained)), steps, color="gray")
    right.set_xticks(range(len(trained)), [f"{m} train" for m in trained])
    right.set(ylabel="wall seconds per training step", title="Training step time")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def write_results(out: Path, meta: dict, rows: dict) -> str:
    from t2mlr_jax.train.metrics_log import json_safe

    (out / "results.json").write_text(json.dumps(json_safe({"meta": meta, "rows": rows}), indent=1))
    markdown = render(meta, rows)
    (out / "results.md").write_text(markdown)
    plot(meta, rows, out / "results.png")
    return markdown


# ---------------------------------------------------------------------------------------------- main


def compare(config, out: Path) -> dict:
    """Train and evaluate both rows of `config` into `out` (already checked); mode -> row result. Stops at
    a row whose training a signal stopped (rerun to resume)."""
    configs = row_configs(config)

    def report(mode: str, seed: int, result: dict, seconds: float) -> str:
        e = result["eval"]
        return f"{mode} train: eval loss exact {e['exact']['loss']:.4f}, jacobi {e['jacobi']['loss']:.4f}"

    run_mode = lambda mode, seed: run_row(mode, configs[mode], out)
    study = runner.Study(runner.grid(MODES, [config.seed]), run_mode, report=report, desc="rows")
    return runner.by_row(runner.run(study).results)


def longest_eval_row(config) -> int:
    from t2mlr_jax.experiment import resolve
    from t2mlr_jax.train.build_data import build_data_source

    return max(
        int((b["segment_ids"] > 0).sum(axis=1).max())
        for b in build_data_source(resolve(config), train=False).eval_batches()
    )


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    out = Path(args.out or f"runs/jacobi_vs_exact_{args.preset}")
    started = time.time()
    try:  # every run built and checked before anything is compiled
        config = preset_config(PRESETS[args.preset], args)
        for value, field in ((args.d_forward, "d_forward"), (args.d_backward, "d_backward")):
            if value is not None:
                config.model.recurrence[field] = value
        configs = row_configs(config)
        for mode, row_config in configs.items():
            check_run(row_config, out / mode)
        longest = longest_eval_row(config)
    except (ValueError, KeyError, FileNotFoundError) as e:
        fail(e)
    out.mkdir(parents=True, exist_ok=True)
    setup_jax(out)
    rows = compare(config, out)
    meta = {
        **environment(args.preset, COMMAND, argv),
        "seed": args.seed,
        "d_forward": config.model.recurrence.d_forward,
        "d_backward": config.model.recurrence.d_backward,
        "longest_eval_row": longest,
        "wall_seconds": round(time.time() - started, 1),
    }
    if not rows:
        return {"meta": meta, "rows": {}}
    markdown = write_results(out, meta, rows)
    print(markdown)
    return {"meta": meta, "rows": rows}
