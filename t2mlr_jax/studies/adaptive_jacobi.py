"""Convergence-adaptive Jacobi (issue 13, beyond the paper): on a trained T²MLR checkpoint, the Jacobi
training step at fixed depths D against the adaptive one (model.recurrence.jacobi_tolerance: the detached
passes stop once R moves by less than the tolerance, at most --max_d passes), and the plain transformer
step of the same backbone (the checkpoint's weights without the fusion) for the ratio.

Per variant, on the same training batches and weights: the training loss, the Jacobi passes used (the
`jacobi_passes` the training forward reports; D itself when fixed) and the wall seconds of the step's
gradient (t2mlr_jax.train.train_step.make_grad_fn: forward and backward, jitted; the optimizer update is
the same for every variant and left out). Times are interleaved side by side (the order rotated per
repetition, compilation excluded) and the ratio to the plain step is the median of the per-repetition
ratios. All variants keep the checkpoint's B = d_backward (at most D). The target: an adaptive step <=
1.6x the plain step at the loss of the fixed D = --max_d.

  python -m experiments.adaptive_jacobi --preset=cpu          # trains its own S5 checkpoint (Jacobi) first
  python -m experiments.adaptive_jacobi --preset=cpu --checkpoint=runs/adaptive_jacobi_cpu/checkpoint

Without --checkpoint the preset's config is trained first, by the framework's trainer, into
<out>/checkpoint (resumable: a rerun reuses it). Writes, in --out (default runs/adaptive_jacobi_<preset>):
  results.json  meta (command, checkpoint, batches, B) and per variant: loss, passes (mean and per
                batch), seconds per step (median and every repetition), ratio to the plain step
  results.md    the table; also printed
  results.png   seconds per step per variant (with 1.6x the plain step) and loss against seconds
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

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
from t2mlr_jax.studies.gradient_fidelity import jacobi_config, positive_ints

COMMAND = "python -m experiments.adaptive_jacobi"
PRESETS = {
    "cpu": Preset(
        "configs/s5_retrieval_t2mlr.py:cpu",
        {"t2mlr.forward_mode": "jacobi", "train.steps": 200},
        "S5-retrieval's cpu preset (parity, 64 x 4, D=16, B=4) trained 200 steps with the Jacobi forward "
        "unless --checkpoint is given; steps on training batches of 32 rows of up to 26 tokens",
    ),
    "tiny": Preset(
        "configs/s5_retrieval_t2mlr.py:cpu",
        {
            "t2mlr.forward_mode": "jacobi",
            "model.hidden_size": 32,
            "model.num_heads": 2,
            "model.num_kv_heads": 2,
            "model.head_dim": 16,
            "model.mlp_dim": 64,
            "data.options.max_actions": 2,
            "data.eval_options.max_actions": 2,
            "data.seq_len": 9,
            "eval.window": 9,
            "train.steps": 2,
            "train.batch_size": 8,
            "train.log_every": 1,
            "train.checkpoint_every": 2,
            "train.progress": False,
            "eval.num_examples": 8,
            "eval.batch_size": 8,
        },
        "a seconds-long smoke run: a 32-wide model on rows of up to 9 tokens, trained 2 steps",
    ),
}
TARGET_RATIO = 1.6  # the bound on the adaptive step, in plain transformer steps


def tolerances(text: str) -> tuple[float, ...]:
    """A comma list of finite tolerances > 0 (argparse type); 0 would be the fixed depth."""
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of numbers, got {text!r}") from None
    if not values or not all(0 < v < math.inf for v in values):
        raise argparse.ArgumentTypeError(f"expected finite numbers > 0, got {text!r}")
    return values


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = OneLineParser(prog=COMMAND, description=__doc__)
    add_config_flags(parser, PRESETS, "adaptive_jacobi")
    add_checkpoint_flag(parser)
    parser.add_argument("--d_forward", type=positive_ints, default=(4, 8, 16), help="the fixed depths D")
    parser.add_argument("--tolerances", type=tolerances, default=(1e-2, 1e-3, 1e-4), help="adaptive ones")
    parser.add_argument("--max_d", type=positive_ints, default=(16,), help="the adaptive variants' D")
    parser.add_argument("--batches", type=int, default=4, help="training batches each step runs over")
    parser.add_argument("--repeats", type=int, default=5, help="timed repetitions (rounds of every variant)")
    return parser.parse_args(argv)


def variants(d_forwards, tols, max_d: int) -> list[dict]:
    """The plain step, each fixed D, then each tolerance at D = max_d (the fixed max_d always included,
    as the loss the adaptive ones should match)."""
    fixed = sorted({*d_forwards, max_d})
    return [
        {"name": "plain transformer", "d_forward": None, "tolerance": None},
        *({"name": f"Jacobi D={d}", "d_forward": d, "tolerance": None} for d in fixed),
        *({"name": f"adaptive tol={t:g}", "d_forward": max_d, "tolerance": t} for t in tols),
    ]


# ---------------------------------------------------------------------------------------------- measuring


def variant_arch(config, variant: dict):
    """The architecture of a variant: the plain backbone (T²MLR's width) or T²MLR's Jacobi training."""
    from t2mlr_jax.architectures import build_architecture
    from t2mlr_jax.experiment import resolve

    if variant["d_forward"] is None:
        config = config.copy_and_resolve_references()
        config.baseline.param_match = False
        return build_architecture(resolve(config), "transformer")
    d = variant["d_forward"]
    config = jacobi_config(config, d, min(d, config.model.recurrence.d_backward))  # the model refuses B > D
    config.model.recurrence.jacobi_tolerance = variant["tolerance"]
    return build_architecture(resolve(config))


def train_batches(config, count: int) -> list[dict]:
    """The first `count` training batches, as the train step consumes them."""
    import itertools

    from t2mlr_jax.experiment import resolve
    from t2mlr_jax.train.build_data import build_data_source
    from t2mlr_jax.train.train_step import model_inputs

    return [
        model_inputs(b) for b in itertools.islice(build_data_source(resolve(config)).train_iterator(), count)
    ]


def measure(config, params: dict, batches: list[dict], cells: list[dict], repeats: int) -> list[dict]:
    """Each variant's loss and passes on `batches` (means over them) and its seconds per step, interleaved
    with the others; `ratio` is the median per-repetition ratio to the first variant (the plain step)."""
    import jax

    from t2mlr_jax.studies.benchmarks.harness import measure_interleaved, median, median_ratio, progress
    from t2mlr_jax.train.train_step import make_grad_fn

    rng = jax.random.PRNGKey(0)

    def steps(grad_fn, weights, state):
        return lambda: [grad_fn(weights, batch, state, rng) for batch in batches]

    runners, by_name = {}, {c["name"]: c for c in cells}

    def compiled(name: str) -> dict:
        """The variant's step compiled (kept in `runners` for the timing) and its loss and passes."""
        cell = by_name[name]
        arch = variant_arch(config, cell)
        weights = {k: params[k] for k in arch.specs}  # the plain backbone: all but the fusion's
        runners[name] = steps(jax.jit(make_grad_fn(arch)), weights, arch.init_model_state())
        sums = [jax.device_get(metric_sums) for _, (metric_sums, _) in runners[name]()]
        logged = lambda key: [float(s[key][0] / s[key][1]) for s in sums]  # means over recurrent tokens
        adaptive = cell["tolerance"] is not None
        per_batch = logged("jacobi_passes") if adaptive else None
        return {
            **cell,
            "loss": float(np.mean([s["loss"][0] / s["loss"][1] for s in sums])),
            "passes": cell["d_forward"] if per_batch is None else float(np.mean(per_batch)),
            "passes_per_batch": per_batch,
            # convergence: each batch's last detached pass's change and whether it met the tolerance
            # (not: its passes stopped at the cap still moving)
            "final_change_per_batch": logged("jacobi_change") if adaptive else None,
            "converged_per_batch": [bool(c) for c in logged("jacobi_converged")] if adaptive else None,
        }

    # the variants × one repeat, a table of the study runner; the timing is across them, interleaved, after
    units = runner.grid(list(by_name))
    study = runner.Study(units, lambda name, _: compiled(name), desc="compiling variants")
    rows = list(runner.by_row(runner.run(study).results).values())
    seconds = measure_interleaved(runners, repeats, progress("timed steps", len(cells) * (repeats + 1)))
    plain = seconds[cells[0]["name"]]
    for row in rows:
        times = [t / len(batches) for t in seconds[row["name"]]]
        row.update(seconds=median(times), seconds_all=times, ratio=median_ratio(seconds[row["name"]], plain))
    return rows


# ---------------------------------------------------------------------------------------------- report


def render(meta: dict, rows: list[dict]) -> str:
    reference = next(r for r in rows if r["d_forward"] == meta["max_d"] and r["tolerance"] is None)
    table = [
        [
            r["name"],
            "—" if r["d_forward"] is None else r["d_forward"],
            "—" if r["passes"] is None else f"{r['passes']:.2f}",
            "—"
            if r["converged_per_batch"] is None
            else f"{sum(r['converged_per_batch'])}/{len(r['converged_per_batch'])}",
            f"{r['loss']:.4f}",
            "—" if r["d_forward"] is None else f"{r['loss'] - reference['loss']:+.2e}",
            f"{1e3 * r['seconds']:.1f}",
            f"{r['ratio']:.2f}×",
        ]
        for r in rows
    ]
    met = ", ".join(r["name"] for r in rows if r["tolerance"] and r["ratio"] <= TARGET_RATIO) or "none"
    verdict = f"Target, an adaptive step <= {TARGET_RATIO}× the plain one at D={meta['max_d']}'s loss: {met}."
    return (
        "\n".join(
            [
                f"# Convergence-adaptive Jacobi against fixed depths ({meta['preset']})",
                "",
                f"`{meta['command']}` on {meta['device']}, jax {meta['jax']}; wall time "
                f"{meta['wall_seconds']:.0f} s (this invocation). Checkpoint `{meta['checkpoint']}`; "
                f"{meta['batches']} training batches of {meta['rows_per_batch']} rows (up to "
                f"{meta['longest_row']} tokens), B = {meta['d_backward']}; {meta['repeats']} interleaved "
                "repetitions.",
                "",
                markdown_table(
                    [
                        "variant",
                        "D (max)",
                        "passes used",
                        "converged",
                        "loss",
                        f"Δloss vs D={meta['max_d']}",
                        "ms/step",
                        "× plain",
                    ],
                    table,
                ),
                "",
                verdict,
                "",
                "- passes used: the mean over the batches of the passes the forward reports "
                "(`jacobi_passes`); fixed variants run D. converged: the batches whose last detached pass "
                "moved R by less than the tolerance (`jacobi_converged`; the others stopped at the cap, "
                "still moving: marked, their final change in results.json).",
                "- ms/step: the median over repetitions of one training step's gradient (forward + "
                "backward, jitted), per batch; × plain: the median of the per-repetition ratios to the "
                "plain step.",
                "- The plain transformer is the checkpoint's backbone without the fusion: its loss is not "
                "the model's, only its time is compared.",
            ]
        )
        + "\n"
    )


def plot(meta: dict, rows: list[dict], path: Path) -> None:
    fig, (bars, scatter) = subplots(1, 2, figsize=(11, 4), layout="constrained")
    names = [r["name"] for r in rows]
    colors = [
        "gray" if r["d_forward"] is None else "tab:orange" if r["tolerance"] else "tab:blue" for r in rows
    ]
    bars.bar(range(len(rows)), [1e3 * r["seconds"] for r in rows], color=colors)
    bars.axhline(
        1e3 * TARGET_RATIO * rows[0]["seconds"], color="k", ls="--", lw=1, label=f"{TARGET_RATIO}× plain"
    )
    bars.set_xticks(range(len(rows)), names, rotation=30, ha="right", fontsize=8)
    bars.set_ylabel("ms per training step")
    bars.legend(fontsize=8)
    markers = iter("os^vD<>ph*")
    for r, c in zip(rows[1:], colors[1:]):  # a legend, not annotations: equal-loss points overlap
        label = f"{r['name']} ({r['passes']:.1f} passes)"
        scatter.scatter(1e3 * r["seconds"], r["loss"], color=c, marker=next(markers, "o"), label=label)
    scatter.legend(fontsize=7)
    scatter.set_xlabel("ms per training step")
    scatter.set_ylabel("training loss")
    fig.suptitle(f"Adaptive vs fixed-depth Jacobi ({meta['preset']}, B = {meta['d_backward']})")
    fig.savefig(path, dpi=120)


def write_results(out: Path, meta: dict, rows: list[dict]) -> str:
    from t2mlr_jax.train.metrics_log import json_safe

    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(json_safe({"meta": meta, "variants": rows}), indent=1))
    markdown = render(meta, rows)
    (out / "results.md").write_text(markdown)
    plot(meta, rows, out / "results.png")
    return markdown


# ---------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> list[dict]:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    out = Path(args.out or f"runs/adaptive_jacobi_{args.preset}")
    started = time.time()
    try:  # everything checked before anything is compiled
        config = preset_config(PRESETS[args.preset], args)
        if len(args.max_d) != 1:
            raise ValueError(f"--max_d takes one depth, got {','.join(map(str, args.max_d))}")
        for name in ("batches", "repeats"):
            if getattr(args, name) < 1:
                raise ValueError(f"--{name} must be >= 1, got {getattr(args, name)}")
        cells = variants(args.d_forward, args.tolerances, args.max_d[0])
        checkpoint, loader = given_or_trained(config, args.checkpoint, out)
        batches = train_batches(config, args.batches)
    except (ValueError, KeyError, FileNotFoundError) as e:
        fail(e)
    setup_jax(out)
    params = checkpoint_params(config, checkpoint, loader)
    if params is None:
        return []
    rows = measure(config, params, batches, cells, args.repeats)
    meta = {
        **environment(args.preset, COMMAND, argv),
        "checkpoint": str(checkpoint),
        "batches": len(batches),
        "rows_per_batch": int(batches[0]["tokens"].shape[0]),
        "longest_row": int(max((b["segment_ids"] > 0).sum(axis=1).max() for b in batches)),
        "d_backward": int(config.model.recurrence.d_backward),
        "max_d": args.max_d[0],
        "repeats": args.repeats,
        "wall_seconds": round(time.time() - started, 1),
    }
    markdown = write_results(out, meta, rows)
    print(markdown)
    return rows
