"""Training step (the paper's Table 12): the Jacobi train step's time relative to the baseline step, next
to its FLOP ratio as the architectures count it, and as measured from the traced jaxpr and by XLA."""

from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.studies.benchmarks.flops import expected_train_flops, xla_flops
from t2mlr_jax.studies.benchmarks.harness import (
    Bench,
    TrainRun,
    measure_interleaved,
    median,
    median_ratio,
    progress,
)
from t2mlr_jax.studies.benchmarks.presets import Preset
from t2mlr_jax.studies.benchmarks.report import layers, markdown_table, ms, times

TITLE = "Training step (Table 12)"
PAPER_TRAIN_WALL_CLOCK = {"(13,18)": 2.24}


def run(bench: Bench) -> dict:
    p = bench.preset
    cases = {"baseline": bench.baseline, **{r: bench.t2mlr(r) for r in p.train_ranges}}
    with progress("train", len(cases) * (p.repeats + 2)) as bar:
        runs = {}
        for name, cfg in cases.items():
            runs[name] = bench.train_run(cfg, p.d_forward, p.d_backward)
            bar.update()
        seconds = measure_interleaved(runs, p.repeats, bar)
    base = _costs(cases["baseline"], runs["baseline"], p)
    rows = []
    for name, cfg in cases.items():
        costs = _costs(cfg, runs[name], p)
        time_ratio = median_ratio(seconds[name], seconds["baseline"])
        flop_ratio = costs["flops"] / base["flops"]
        rows.append(
            {
                "variant": name,
                "code_range": list(cfg.layer_range) if cfg.recurrence else None,
                "d_forward": p.d_forward,
                "d_backward": p.d_backward,
                "batch": p.train_batch,
                "seq": p.train_seq,
                "seconds": median(seconds[name]),
                "seconds_all": seconds[name],
                "time_ratio": time_ratio,
                **costs,
                "flop_ratio": flop_ratio,
                "flop_ratio_jaxpr": costs["flops_jaxpr"] / base["flops_jaxpr"],
                "flop_ratio_xla": _ratio(costs["flops_xla"], base["flops_xla"]),
                "time_over_flop_ratio": time_ratio / flop_ratio,
                "paper_wall_clock_ratio": bench.paper(PAPER_TRAIN_WALL_CLOCK, name),
            }
        )
    table = markdown_table(
        [
            "variant",
            "code range",
            "step ms",
            "time ratio",
            "FLOP ratio (counted)",
            "FLOP ratio (jaxpr)",
            "FLOP ratio (XLA)",
            "time / FLOP ratio",
            "paper",
        ],
        [
            [
                r["variant"],
                layers(r["code_range"]),
                ms(r["seconds"]),
                times(r["time_ratio"]),
                times(r["flop_ratio"]),
                times(r["flop_ratio_jaxpr"]),
                times(r["flop_ratio_xla"]),
                f"{r['time_over_flop_ratio']:.3f}",
                times(r["paper_wall_clock_ratio"]),
            ]
            for r in rows
        ],
    )
    notes = [
        f"Train step = value_and_grad(cross-entropy) + AdamW, jitted with donation; Jacobi D={p.d_forward}, "
        f"B={p.d_backward}; batch {p.train_batch} x {p.train_seq} tokens.",
        "Counted: the architectures' training FLOPs (flops_per_step; T²MLR's t2mlr_jax/architectures/t2mlr/"
        "flops.py: forward L + D*M block passes; backward 2x forward of the blocks below l_start, the final "
        "pass and the last B refinements; causal attention). jaxpr: dot_general FLOPs of the traced step, "
        "scan bodies times their trip count, attention dense (the masked scores are computed). XLA: "
        "compiled.cost_analysis()['flops'], which counts each loop body (layer scan, Jacobi passes) once, "
        "so it is no cross-check here.",
        "Goal: time ratio within 10% of the FLOP ratio (time / FLOP ratio in [0.9, 1.1]) and <= 2.0x for "
        "(13,18) on 30 layers (paper: 2.24x wall-clock).",
    ]
    return {"rows": rows, "markdown": table, "notes": notes}


def _costs(cfg: ModelConfig, step: TrainRun, p: Preset) -> dict:
    return {
        "flops": expected_train_flops(cfg, p.train_batch, p.train_seq, p.d_forward, p.d_backward),
        "flops_jaxpr": step.jaxpr_flops,
        "flops_xla": xla_flops(step.compiled),
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if not a or not b else a / b
