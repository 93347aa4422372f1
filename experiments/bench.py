#!/usr/bin/env python
"""Cost of T²MLR against its parameter-matched transformer (the paper's Tables 7, 8 and 12).

Sections (--sections, comma separated; default all):
  decode      generation time relative to the baseline (Table 7)
  train       Jacobi train-step time relative to the baseline step, next to counted FLOP ratios (Table 12)
  prefill     Jacobi prefill (D = 4..32) against exact prefill: speed-up and deviation (Table 8)
  memory      decode state and compiled train-step memory; the stop-gradient Jacobi passes keep nothing
  throughput  tokens/s and MFU of the train and decode measurements (runs those two sections too)

Every ratio is measured side by side: the variants are interleaved in each repetition (order rotated
per repetition), a warm-up call excludes compilation, each timed call is wrapped in block_until_ready,
and the median over repetitions of the per-repetition ratio is reported.

  python experiments/bench.py --preset=quick --out_dir=runs/bench      # CPU, a few minutes
  python experiments/bench.py --preset=full --out_dir=runs/bench_full   # SmolLM2-135M shapes, bf16, accelerator

Writes <out_dir>/bench_<preset>.json and <out_dir>/bench_<preset>.md and prints the markdown.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm import tqdm

from t2mlr_jax.model.backbone import init_cache
from t2mlr_jax.model.config import ModelConfig, smollm2_135m
from t2mlr_jax.model.generate import generate
from t2mlr_jax.model.params import init_params
from t2mlr_jax.model.recurrence import exact_forward, jacobi_forward
from t2mlr_jax.model.spec import count_params

SECTIONS = ("decode", "train", "prefill", "memory", "throughput")
NEEDS = {"throughput": ("decode", "train")}  # throughput is computed from these sections' timings

# The paper's ranges on the 30-layer SmolLM2-135M: (a, b) 1-based -> code l_start (l_end = L-1-l_start).
PAPER_LAYERS = 30
PAPER_L_START = {"(1,30)": 0, "(5,26)": 4, "(9,22)": 8, "(13,18)": 12}
# Table 7 (135M generation time / baseline) and Table 8 (Jacobi prefill speed-up over exact).
PAPER_DECODE = {
    ("(1,30)", 512): 1.070,
    ("(1,30)", 1024): 1.064,
    ("(1,30)", 2048): 1.067,
    ("(5,26)", 512): 1.076,
    ("(5,26)", 1024): 1.068,
    ("(5,26)", 2048): 1.076,
    ("(9,22)", 512): 1.082,
    ("(9,22)", 1024): 1.078,
    ("(9,22)", 2048): 1.078,
}
PAPER_PREFILL = {
    ("(5,26)", 4): 3.6,
    ("(5,26)", 8): 6.2,
    ("(5,26)", 16): 11.1,
    ("(5,26)", 32): 20.5,
    ("(9,22)", 4): 2.7,
    ("(9,22)", 8): 4.6,
    ("(9,22)", 16): 8.0,
    ("(9,22)", 32): 14.5,
    ("(13,18)", 4): 1.8,
    ("(13,18)", 8): 2.7,
    ("(13,18)", 16): 4.3,
    ("(13,18)", 32): 7.7,
}
PAPER_TRAIN_WALL_CLOCK = {"(13,18)": 2.24}
# Dense bf16 peak TFLOP/s per chip, matched against device_kind in this order.
PEAK_TFLOPS = (
    ("h100", 989.0),
    ("h200", 989.0),
    ("v5 lite", 197.0),
    ("v5e", 197.0),
    ("v5p", 459.0),
    ("v5", 459.0),
)


@dataclasses.dataclass(frozen=True)
class Preset:
    model: ModelConfig  # the T²MLR backbone; the recurrence range is set per variant
    repeats: int
    decode_ranges: tuple[str, ...]
    decode_lengths: tuple[int, ...]
    decode_batches: tuple[int, ...]
    prompt_len: int  # Table 7 generates from BOS
    train_ranges: tuple[str, ...]
    train_batch: int
    train_seq: int
    d_forward: int
    d_backward: int
    prefill_ranges: tuple[str, ...]
    prefill_depths: tuple[int, ...]
    prefill_batch: int
    prefill_seq: int
    prefill_gamma: float = 0.5  # gammas set non-zero so that the recurrence changes the logits


ALL_RANGES = tuple(PAPER_L_START)
PRESETS = {
    # Test-sized: seconds, compile-bound.
    "smoke": Preset(
        model=smollm2_135m(
            vocab_size=256,
            hidden_size=32,
            num_layers=4,
            num_heads=2,
            num_kv_heads=1,
            head_dim=16,
            mlp_dim=88,
            max_seq_len=128,
        ),
        repeats=2,
        decode_ranges=("(13,18)",),
        decode_lengths=(8,),
        decode_batches=(1,),
        prompt_len=1,
        train_ranges=("(13,18)",),
        train_batch=2,
        train_seq=16,
        d_forward=4,
        d_backward=2,
        prefill_ranges=("(13,18)",),
        prefill_depths=(2, 4),
        prefill_batch=2,
        prefill_seq=8,
    ),
    # CPU-sized SmolLM2 (8 layers, d 128, MLP and vocab scaled with it); lengths 1/8 of the paper's.
    "quick": Preset(
        model=smollm2_135m(
            vocab_size=4096,
            hidden_size=128,
            num_layers=8,
            num_heads=4,
            num_kv_heads=2,
            head_dim=32,
            mlp_dim=344,
            max_seq_len=1024,
        ),
        repeats=3,
        decode_ranges=ALL_RANGES,
        decode_lengths=(64, 128, 256),
        decode_batches=(1,),
        prompt_len=1,
        train_ranges=("(13,18)",),
        train_batch=4,
        train_seq=128,
        d_forward=16,
        d_backward=4,
        prefill_ranges=("(5,26)", "(13,18)"),
        prefill_depths=(4, 8, 16, 32),
        prefill_batch=4,
        prefill_seq=64,
    ),
    # The real SmolLM2-135M shapes in bf16 (parameters fp32 for training, bf16 for inference).
    "full": Preset(
        model=smollm2_135m(dtype="bfloat16"),
        repeats=5,
        decode_ranges=ALL_RANGES,
        decode_lengths=(512, 1024, 2048),
        decode_batches=(1, 8),
        prompt_len=1,
        train_ranges=("(13,18)", "(5,26)"),
        train_batch=8,
        train_seq=2048,
        d_forward=16,
        d_backward=4,
        prefill_ranges=("(5,26)", "(9,22)", "(13,18)"),
        prefill_depths=(4, 8, 16, 32),
        prefill_batch=8,
        prefill_seq=512,
    ),
}


# ---------------------------------------------------------------------------------------------
# Models


def code_range(paper_range: str, num_layers: int) -> tuple[int, int]:
    """The paper's symmetric 30-layer range scaled to `num_layers` (identity at 30 layers)."""
    l_start = min(round(PAPER_L_START[paper_range] * num_layers / PAPER_LAYERS), (num_layers - 1) // 2)
    return l_start, num_layers - 1 - l_start


def with_range(cfg: ModelConfig, paper_range: str) -> ModelConfig:
    l_start, l_end = code_range(paper_range, cfg.num_layers)
    return cfg.with_recurrence(l_start=l_start, l_end=l_end).validate()


@cache
def param_shapes(cfg: ModelConfig) -> dict:
    return jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))


def num_params(cfg: ModelConfig) -> int:
    return count_params(param_shapes(cfg))


def matched_baseline(cfg: ModelConfig, multiple: int = 8) -> ModelConfig:
    """The plain transformer widened in steps of `multiple` until it has at least T²MLR's parameters
    (the paper's 576 -> 584; heads and head_dim unchanged, so the baseline is the conservative side)."""
    target = num_params(cfg.with_recurrence())
    hidden = cfg.hidden_size
    while num_params(cfg.replace(hidden_size=hidden, recurrence=None)) < target:
        hidden += multiple
    return cfg.replace(hidden_size=hidden, recurrence=None)


def inference_config(cfg: ModelConfig) -> ModelConfig:
    """Weights stored in the compute dtype, as served; training keeps fp32 master weights."""
    return cfg.replace(param_dtype=cfg.dtype)


def with_gammas(params: dict, gamma: float) -> dict:
    mixer = {
        k: jnp.full_like(v, gamma) if k.startswith("rezero_gamma") else v for k, v in params["mixer"].items()
    }
    return {**params, "mixer": mixer}


def random_tokens(cfg: ModelConfig, batch: int, length: int, seed: int) -> jax.Array:
    return jax.random.randint(jax.random.PRNGKey(seed), (batch, length), 1, cfg.vocab_size, jnp.int32)


# ---------------------------------------------------------------------------------------------
# FLOPs: matmuls only, attention counted dense (the masked T x S scores are computed in full, no
# causal halving), embedding lookups free.


def layer_matmul_params(cfg: ModelConfig) -> int:
    d, attn, kv = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    return 2 * d * attn + 2 * d * kv + 3 * d * cfg.mlp_dim


def mixer_matmul_params(cfg: ModelConfig) -> int:
    if cfg.recurrence is None:
        return 0
    return sum(x.size for x in jax.tree.leaves(param_shapes(cfg)["mixer"]) if x.ndim == 2)


def forward_flops(
    cfg: ModelConfig, batch: int, queries: int, keys: int, layer_passes: int, fusions: int
) -> float:
    """`layer_passes` blocks and `fusions` fusion modules over `queries` tokens attending to `keys`, plus the head."""
    per_layer = 2 * queries * layer_matmul_params(cfg) + 4 * queries * keys * cfg.num_heads * cfg.head_dim
    fusion = 2 * queries * mixer_matmul_params(cfg)
    head = 2 * queries * cfg.hidden_size * cfg.vocab_size
    return float(batch * (layer_passes * per_layer + fusions * fusion + head))


def train_flops(cfg: ModelConfig, batch: int, seq: int, d_forward: int, d_backward: int) -> float:
    """One step: the forward, plus a backward of 2x forward for the passes that carry gradient.

    Jacobi forward: blocks [0, l_end] unfused, D-1 middle-block refinements, blocks [l_start, L) once more:
    L + D*M block passes (M = middle-block size) and D fusions. Gradient reaches blocks below l_start,
    the final pass and the last min(B, D-1) refinements; the unfused middle pass only when B >= D.
    """
    layers = cfg.num_layers
    if cfg.recurrence is None:
        return 3 * forward_flops(cfg, batch, seq, seq, layers, 0)
    l_start, l_end = cfg.layer_range
    middle = l_end - l_start + 1
    n_grad = min(d_backward, d_forward - 1)
    forward = forward_flops(cfg, batch, seq, seq, layers + d_forward * middle, d_forward)
    grad_passes = layers + n_grad * middle + (middle if d_backward >= d_forward else 0)
    return forward + 2 * forward_flops(cfg, batch, seq, seq, grad_passes, n_grad + 1)


def decode_flops(cfg: ModelConfig, batch: int, prompt_len: int, new_tokens: int) -> float:
    """The decode steps (prefill of the short prompt left out); every step attends to all cache slots."""
    fusions = 0 if cfg.recurrence is None else 1
    return new_tokens * forward_flops(cfg, batch, 1, prompt_len + new_tokens, cfg.num_layers, fusions)


def _sub_jaxprs(value):
    if hasattr(value, "eqns"):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _sub_jaxprs(item)


def jaxpr_matmul_flops(jaxpr) -> float:
    """dot_general FLOPs of a jaxpr as traced, scan bodies times their length (what XLA's cost
    analysis cannot do: it counts a loop body once)."""
    total = 0.0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            lhs, rhs = (v.aval.shape for v in eqn.invars)
            (_, rhs_contract), (_, rhs_batch) = eqn.params["dimension_numbers"]
            shared = np.prod([rhs[i] for i in (*rhs_contract, *rhs_batch)])
            total += 2.0 * np.prod(lhs) * np.prod(rhs) / shared
        inner = [jaxpr_matmul_flops(j) for value in eqn.params.values() for j in _sub_jaxprs(value)]
        if eqn.primitive.name == "cond":
            total += max(inner, default=0.0)
        else:
            total += sum(inner) * eqn.params.get("length", 1)
    return float(total)


def xla_flops(compiled) -> float | None:
    analysis = compiled.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
    return None if not analysis or "flops" not in analysis else float(analysis["flops"])


def memory_stats(compiled) -> dict:
    """Compiled buffer sizes; peak ~ arguments + outputs - donated aliases + temporaries."""
    m = compiled.memory_analysis()
    stats = {
        "argument_bytes": m.argument_size_in_bytes,
        "output_bytes": m.output_size_in_bytes,
        "alias_bytes": m.alias_size_in_bytes,
        "temp_bytes": m.temp_size_in_bytes,
    }
    stats["peak_bytes"] = (
        stats["argument_bytes"] + stats["output_bytes"] - stats["alias_bytes"] + stats["temp_bytes"]
    )
    return stats


# ---------------------------------------------------------------------------------------------
# Timing


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start


def measure_interleaved(
    runners: dict[str, Callable[[], Any]], repeats: int, bar: tqdm
) -> dict[str, list[float]]:
    """Seconds per call of each runner: one warm-up call each (compilation), then `repeats` rounds in which
    every runner runs once, the order rotated per round so that no variant always runs first."""
    for fn in runners.values():
        jax.block_until_ready(fn())
        bar.update()
    names = list(runners)
    seconds = {name: [] for name in names}
    for rep in range(repeats):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            seconds[name].append(timed(runners[name]))
            bar.update()
    return seconds


def median(values) -> float:
    return float(np.median(values))


def median_ratio(numerator: list[float], denominator: list[float]) -> float:
    """Median over repetitions of the ratio measured within each repetition."""
    return median(np.asarray(numerator) / np.asarray(denominator))


def progress(desc: str, total: int) -> tqdm:
    return tqdm(total=total, desc=desc, unit="call", file=sys.stderr, leave=False)


# ---------------------------------------------------------------------------------------------
# Train step


def make_train_step(
    cfg: ModelConfig, d_forward: int, d_backward: int, optimizer: optax.GradientTransformation
):
    def loss_fn(params, tokens):
        logits = jacobi_forward(cfg, params, tokens, d_forward=d_forward, d_backward=d_backward).logits
        return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], tokens[:, 1:]).mean()

    def step(params, opt_state, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return jax.jit(step, donate_argnums=(0, 1))


class TrainRun:
    """One compiled train step (parameters and optimizer state donated) and the state it advances."""

    def __init__(self, cfg: ModelConfig, d_forward: int, d_backward: int, batch: int, seq: int, seed: int):
        optimizer = optax.adamw(6e-4, b1=0.9, b2=0.98, weight_decay=0.01)  # the release's pretraining AdamW
        params = init_params(cfg, jax.random.PRNGKey(seed))
        self.state = (params, optimizer.init(params))
        self.tokens = random_tokens(cfg, batch, seq, seed + 1)
        traced = make_train_step(cfg, d_forward, d_backward, optimizer).trace(*self.state, self.tokens)
        self.jaxpr_flops = jaxpr_matmul_flops(traced.jaxpr)
        self.compiled = traced.lower().compile()

    def __call__(self):
        params, opt_state, loss = self.compiled(*self.state, self.tokens)
        self.state = (params, opt_state)
        return self.state, loss


class DecodeRun:
    """One compiled generate() (greedy, from a constant prompt); calling it generates once."""

    def __init__(self, cfg: ModelConfig, params: dict, batch: int, prompt_len: int, new_tokens: int):
        prompt = jnp.ones((batch, prompt_len), jnp.int32)
        self.args = (params, prompt, jnp.ones_like(prompt))
        fn = jax.jit(lambda p, t, m: generate(cfg, p, t, m, max_new_tokens=new_tokens).tokens)
        self.compiled = fn.lower(*self.args).compile()

    def __call__(self):
        return self.compiled(*self.args)


# ---------------------------------------------------------------------------------------------
# The run


@dataclasses.dataclass
class Bench:
    preset: Preset
    baseline: ModelConfig
    peak_flops: float | None
    seed: int
    results: dict = dataclasses.field(default_factory=dict)
    _memo: dict = dataclasses.field(default_factory=dict)

    def _once(self, key, build: Callable[[], Any]):
        """Build each compiled program or parameter tree once; the memory section reuses the timed ones."""
        if key not in self._memo:
            self._memo[key] = build()
        return self._memo[key]

    def t2mlr(self, paper_range: str) -> ModelConfig:
        return with_range(self.preset.model, paper_range)

    def paper(self, table: dict, key) -> float | None:
        """The paper's figure, shown only next to measurements of its own 30-layer shapes."""
        return table.get(key) if self.preset.model.num_layers == PAPER_LAYERS else None

    def train_run(self, cfg: ModelConfig, d_forward: int, d_backward: int) -> TrainRun:
        p = self.preset
        return self._once(
            ("train", cfg, d_forward, d_backward),
            lambda: TrainRun(cfg, d_forward, d_backward, p.train_batch, p.train_seq, self.seed),
        )

    def decode_run(self, cfg: ModelConfig, batch: int, new_tokens: int) -> DecodeRun:
        return self._once(
            ("decode", cfg, batch, new_tokens),
            lambda: DecodeRun(cfg, self.params(cfg), batch, self.preset.prompt_len, new_tokens),
        )

    def params(self, cfg: ModelConfig) -> dict:
        return self._once(("params", cfg), lambda: init_params(cfg, jax.random.PRNGKey(self.seed)))


def decode_section(bench: Bench) -> dict:
    p = bench.preset
    variants = {
        "baseline": inference_config(bench.baseline),
        **{r: inference_config(bench.t2mlr(r)) for r in p.decode_ranges},
    }
    rows = []
    with progress(
        "decode", len(p.decode_batches) * len(p.decode_lengths) * len(variants) * (p.repeats + 2)
    ) as bar:
        for batch in p.decode_batches:
            for n in p.decode_lengths:
                runners = {}
                for name, cfg in variants.items():
                    runners[name] = bench.decode_run(cfg, batch, n)
                    bar.update()
                seconds = measure_interleaved(runners, p.repeats, bar)
                rows += [
                    {
                        "range": r,
                        "code_range": list(variants[r].layer_range),
                        "batch": batch,
                        "new_tokens": n,
                        "seconds": median(seconds[r]),
                        "baseline_seconds": median(seconds["baseline"]),
                        "ratio": median_ratio(seconds[r], seconds["baseline"]),
                        "paper_ratio": bench.paper(PAPER_DECODE, (r, n)),
                        "seconds_all": seconds[r],
                        "baseline_seconds_all": seconds["baseline"],
                    }
                    for r in p.decode_ranges
                ]
    table = markdown_table(
        ["batch", "new tokens", "T²MLR (paper)", "code range", "baseline ms", "T²MLR ms", "ratio", "paper"],
        [
            [
                r["batch"],
                r["new_tokens"],
                r["range"],
                layers(r["code_range"]),
                ms(r["baseline_seconds"]),
                ms(r["seconds"]),
                times(r["ratio"]),
                times(r["paper_ratio"]),
            ]
            for r in rows
        ],
    )
    notes = [
        "Generation time relative to the parameter-matched baseline, greedy, from a "
        f"{p.prompt_len}-token prompt, exact prefill. Goal <= 1.03x (paper Table 7: 1.04-1.08x)."
    ]
    return {"rows": rows, "markdown": table, "notes": notes}


def train_section(bench: Bench) -> dict:
    p = bench.preset
    cases = {"baseline": bench.baseline, **{r: bench.t2mlr(r) for r in p.train_ranges}}
    with progress("train", len(cases) * (p.repeats + 2)) as bar:
        runs = {}
        for name, cfg in cases.items():
            runs[name] = bench.train_run(cfg, p.d_forward, p.d_backward)
            bar.update()
        seconds = measure_interleaved(runs, p.repeats, bar)
    base = _train_costs(cases["baseline"], runs["baseline"], p)
    rows = []
    for name, cfg in cases.items():
        costs = _train_costs(cfg, runs[name], p)
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
        "Counted: matmul FLOPs by formula (forward L + D*M block passes; backward 2x forward of the blocks "
        "below l_start, the final pass and the last B refinements; dense attention, no causal halving). "
        "jaxpr: dot_general FLOPs of the traced step, scan bodies times their trip count. XLA: "
        "compiled.cost_analysis()['flops'], which counts each loop body (layer scan, Jacobi passes) once, "
        "so it is no cross-check here.",
        "Goal: time ratio within 10% of the FLOP ratio (time / FLOP ratio in [0.9, 1.1]) and <= 2.0x for "
        "(13,18) on 30 layers (paper: 2.24x wall-clock).",
    ]
    return {"rows": rows, "markdown": table, "notes": notes}


def _train_costs(cfg: ModelConfig, run: TrainRun, p: Preset) -> dict:
    return {
        "flops": train_flops(cfg, p.train_batch, p.train_seq, p.d_forward, p.d_backward),
        "flops_jaxpr": run.jaxpr_flops,
        "flops_xla": xla_flops(run.compiled),
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if not a or not b else a / b


def _prefill_fn(cfg: ModelConfig, depth: int | None, batch: int, seq: int):
    """The prompt forward as generate() runs it (logits, next-token R, filled KV cache); depth None = exact."""

    def run(params, tokens):
        cache = init_cache(cfg, batch, seq)
        if depth is None:
            out = exact_forward(cfg, params, tokens, cache=cache)
        else:
            out = jacobi_forward(cfg, params, tokens, cache=cache, d_forward=depth, d_backward=0)
        return out.logits, out.recurrent_state, out.cache

    return jax.jit(run)


@jax.jit
def _deviation(logits, exact_logits, tokens):
    def loss(x):
        return optax.softmax_cross_entropy_with_integer_labels(x[:, :-1], tokens[:, 1:]).mean()

    return (
        jnp.abs(logits - exact_logits).max(),
        loss(logits) - loss(exact_logits),
        jnp.abs(exact_logits).max(),
    )


def prefill_section(bench: Bench) -> dict:
    p = bench.preset
    tokens = random_tokens(p.model, p.prefill_batch, p.prefill_seq, bench.seed + 2)
    params = with_gammas(bench.params(inference_config(bench.t2mlr(p.prefill_ranges[0]))), p.prefill_gamma)
    names = ["exact", *(f"D={k}" for k in p.prefill_depths)]
    rows = []
    with progress("prefill", len(p.prefill_ranges) * len(names) * (p.repeats + 1)) as bar:
        for r in p.prefill_ranges:
            cfg = inference_config(bench.t2mlr(r))
            fns = dict(
                zip(
                    names,
                    (_prefill_fn(cfg, d, p.prefill_batch, p.prefill_seq) for d in (None, *p.prefill_depths)),
                )
            )
            runners = {name: (lambda f=f: f(params, tokens)) for name, f in fns.items()}
            seconds = measure_interleaved(runners, p.repeats, bar)
            exact_logits = fns["exact"](params, tokens)[0]
            for depth, name in zip(p.prefill_depths, names[1:]):
                diff, loss_gap, scale = map(
                    float, _deviation(fns[name](params, tokens)[0], exact_logits, tokens)
                )
                rows.append(
                    {
                        "range": r,
                        "code_range": list(cfg.layer_range),
                        "d_forward": depth,
                        "exact_seconds": median(seconds["exact"]),
                        "seconds": median(seconds[name]),
                        "speedup": median_ratio(seconds["exact"], seconds[name]),
                        "max_abs_logit_diff": diff,
                        "max_abs_exact_logit": scale,
                        "mean_loss_diff": loss_gap,
                        "exact_everywhere": p.prefill_seq <= depth,
                        "paper_speedup": bench.paper(PAPER_PREFILL, (r, depth)),
                    }
                )
    table = markdown_table(
        [
            "T²MLR (paper)",
            "code range",
            "D",
            "exact ms",
            "Jacobi ms",
            "speed-up",
            "paper",
            "max abs Δlogit",
            "max abs logit",
            "Δ mean loss",
        ],
        [
            [
                r["range"],
                layers(r["code_range"]),
                r["d_forward"],
                ms(r["exact_seconds"]),
                ms(r["seconds"]),
                times(r["speedup"]),
                times(r["paper_speedup"]),
                f"{r['max_abs_logit_diff']:.2e}",
                f"{r['max_abs_exact_logit']:.2f}",
                f"{r['mean_loss_diff']:+.2e}",
            ]
            for r in rows
        ],
    )
    notes = [
        f"Prefill of {p.prefill_batch} x {p.prefill_seq} random tokens (logits, R and KV cache) by Jacobi with "
        "D passes vs exact sequential prefill.",
        f"Deviation on a random-init model with every gamma set to {p.prefill_gamma} so that the recurrence "
        "changes the logits: it shows how far Jacobi is from exact, not the task-quality gap of Table 8 "
        "(that needs a trained model). Jacobi is exact at positions < D, so everywhere when D >= prompt length.",
    ]
    return {"rows": rows, "markdown": table, "notes": notes}


def _state_bytes(cfg: ModelConfig, batch: int, slots: int) -> dict:
    cache = jax.eval_shape(lambda: init_cache(cfg, batch, slots))
    kv = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(cache))
    recurrent = 0 if cfg.recurrence is None else batch * cfg.hidden_size * jnp.dtype(cfg.dtype).itemsize
    return {
        "kv_cache_bytes": int(kv),
        "recurrent_state_bytes": int(recurrent),
        "state_bytes": int(kv + recurrent),
    }


def memory_section(bench: Bench) -> dict:
    p = bench.preset
    r = p.train_ranges[0]
    batch, n = max(p.decode_batches), max(p.decode_lengths)
    decode_cases = {"baseline": inference_config(bench.baseline), r: inference_config(bench.t2mlr(r))}
    # The Jacobi step at D and at D' = B+1 (no stop-gradient pass at all), both with gradient through B passes.
    train_cases = [
        ("baseline", bench.baseline, p.d_forward, p.d_backward),
        (r, bench.t2mlr(r), p.d_forward, p.d_backward),
        (r, bench.t2mlr(r), p.d_backward + 1, p.d_backward),
    ]
    with progress("memory", len(decode_cases) + len(train_cases)) as bar:
        decode_rows = []
        for name, cfg in decode_cases.items():
            decode_rows.append(
                {
                    "variant": name,
                    "batch": batch,
                    "slots": p.prompt_len + n,
                    **_state_bytes(cfg, batch, p.prompt_len + n),
                    "compiled": memory_stats(bench.decode_run(cfg, batch, n).compiled),
                }
            )
            bar.update()
        train_rows = []
        for name, cfg, d_forward, d_backward in train_cases:
            stats = memory_stats(bench.train_run(cfg, d_forward, d_backward).compiled)
            train_rows.append({"variant": name, "d_forward": d_forward, "d_backward": d_backward, **stats})
            bar.update()
    _add_ratios(decode_rows, "state_bytes", "state_ratio")
    _add_ratios(train_rows, "peak_bytes", "peak_ratio")
    deep, shallow = train_rows[1], train_rows[2]
    no_activations = deep["temp_bytes"] / shallow["temp_bytes"]
    tables = "\n\n".join(
        [
            markdown_table(
                [
                    "decode",
                    "batch",
                    "cache slots",
                    "KV cache",
                    "recurrent state",
                    "state ratio",
                    "generate() temporaries",
                    "generate() peak",
                ],
                [
                    [
                        d["variant"],
                        d["batch"],
                        d["slots"],
                        size(d["kv_cache_bytes"]),
                        size(d["recurrent_state_bytes"]),
                        times(d["state_ratio"], 5),
                        size(d["compiled"]["temp_bytes"]),
                        size(d["compiled"]["peak_bytes"]),
                    ]
                    for d in decode_rows
                ],
            ),
            markdown_table(
                ["train step", "D", "B", "arguments", "temporaries", "peak", "peak ratio"],
                [
                    [
                        t["variant"],
                        t["d_forward"],
                        t["d_backward"],
                        size(t["argument_bytes"]),
                        size(t["temp_bytes"]),
                        size(t["peak_bytes"]),
                        times(t["peak_ratio"]),
                    ]
                    for t in train_rows
                ],
            ),
        ]
    )
    notes = [
        "Decode state = KV cache (keys, values, slot segment ids) + one d-vector per row for T²MLR. "
        "Compiled peak = arguments + outputs - donated aliases + temporaries (compiled.memory_analysis()).",
        f"Stop-gradient passes keep no activations: temporaries of D={p.d_forward} / D={p.d_backward + 1} "
        f"(both B={p.d_backward}) = {no_activations:.3f} (1.0 = none kept).",
    ]
    return {
        "decode_rows": decode_rows,
        "train_rows": train_rows,
        "temp_ratio_deep_over_shallow": no_activations,
        "markdown": tables,
        "notes": notes,
    }


def _add_ratios(rows: list[dict], key: str, name: str) -> None:
    for row in rows:
        row[name] = row[key] / rows[0][key]


def throughput_section(bench: Bench) -> dict:
    p = bench.preset
    peak, n = bench.peak_flops, max(p.decode_lengths)
    rows = [
        _throughput_row("train", t["variant"], p.train_batch * p.train_seq, t["flops"], t["seconds"], peak)
        for t in bench.results["train"]["rows"]
    ]
    for batch in p.decode_batches:
        decoded = [d for d in bench.results["decode"]["rows"] if d["batch"] == batch and d["new_tokens"] == n]
        rows.append(
            _throughput_row(
                f"decode b={batch}",
                "baseline",
                batch * n,
                decode_flops(bench.baseline, batch, p.prompt_len, n),
                decoded[0]["baseline_seconds"],
                peak,
            )
        )
        rows += [
            _throughput_row(
                f"decode b={batch}",
                d["range"],
                batch * n,
                decode_flops(bench.t2mlr(d["range"]), batch, p.prompt_len, n),
                d["seconds"],
                peak,
            )
            for d in decoded
        ]
    table = markdown_table(
        ["workload", "variant", "tokens/s", "counted GFLOP", "GFLOP/s", "MFU"],
        [
            [
                r["workload"],
                r["variant"],
                f"{r['tokens_per_second']:,.0f}",
                f"{r['flops'] / 1e9:,.1f}",
                f"{r['flops_per_second'] / 1e9:,.1f}",
                "null" if r["mfu"] is None else f"{r['mfu']:.1%}",
            ]
            for r in rows
        ],
    )
    peak_text = (
        "none (CPU or unknown device: pass --peak_tflops)" if peak is None else f"{peak / 1e12:.0f} TFLOP/s"
    )
    notes = [
        f"MFU = counted matmul FLOPs (incl. the Jacobi refinement passes) / time / dense bf16 peak; "
        f"peak {peak_text}. Decode: the longest generation ({n} tokens), every step attending to all cache slots."
    ]
    return {"rows": rows, "peak_flops": peak, "markdown": table, "notes": notes}


def _throughput_row(
    workload: str, variant: str, tokens: int, flops: float, seconds: float, peak: float | None
) -> dict:
    achieved = flops / seconds
    return {
        "workload": workload,
        "variant": variant,
        "tokens_per_second": tokens / seconds,
        "flops": flops,
        "flops_per_second": achieved,
        "mfu": None if peak is None else achieved / peak,
    }


SECTION_FNS = {
    "decode": decode_section,
    "train": train_section,
    "prefill": prefill_section,
    "memory": memory_section,
    "throughput": throughput_section,
}
TITLES = {
    "decode": "Decode (Table 7)",
    "train": "Training step (Table 12)",
    "prefill": "Prefill (Table 8)",
    "memory": "Peak memory",
    "throughput": "Throughput and MFU",
}


# ---------------------------------------------------------------------------------------------
# Output


def markdown_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(map(str, row)) + " |" for row in rows])


def ms(seconds: float) -> str:
    return f"{1e3 * seconds:.1f}"


def times(ratio: float | None, digits: int = 3) -> str:
    return "—" if ratio is None else f"{ratio:.{digits}f}×"


def size(num_bytes: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if num_bytes < 1024:
            return f"{num_bytes:.1f} {unit}"
        num_bytes /= 1024
    return f"{num_bytes:.2f} GiB"


def layers(code_range: list[int] | None) -> str:
    return "—" if code_range is None else f"{code_range[0]}–{code_range[1]}"


def describe(cfg: ModelConfig) -> str:
    return (
        f"{cfg.num_layers} layers, d {cfg.hidden_size}, {cfg.num_heads}/{cfg.num_kv_heads} heads x {cfg.head_dim}, "
        f"MLP {cfg.mlp_dim}, vocab {cfg.vocab_size}, {cfg.dtype}, {num_params(cfg):,} params"
    )


def metadata(name: str, bench: Bench, argv: list[str]) -> dict:
    device = jax.devices()[0]
    return {
        "preset": name,
        "command": " ".join(["python experiments/bench.py", *argv]),
        "device": f"{device.platform}: {device.device_kind}",
        "jax": jax.__version__,
        "python": platform.python_version(),
        "repeats": bench.preset.repeats,
        "seed": bench.seed,
        "t2mlr": describe(bench.preset.model.with_recurrence()),
        "baseline": describe(bench.baseline),
        "preset_settings": {k: v for k, v in dataclasses.asdict(bench.preset).items() if k != "model"},
    }


def render(meta: dict, results: dict) -> str:
    parts = [
        f"# T²MLR cost benchmark ({meta['preset']})",
        "",
        f"`{meta['command']}` on {meta['device']}, jax {meta['jax']}, {meta['repeats']} repetitions "
        "(medians of side-by-side ratios).",
        "",
        f"- T²MLR backbone: {meta['t2mlr']}",
        f"- parameter-matched baseline: {meta['baseline']}",
    ]
    for name, section in results.items():
        parts += [
            "",
            f"## {TITLES[name]}",
            "",
            section["markdown"],
            "",
            *(f"- {n}" for n in section["notes"]),
        ]
    return "\n".join(parts) + "\n"


def resolve_sections(text: str) -> list[str]:
    wanted = {s.strip() for s in text.split(",") if s.strip()}
    unknown = wanted - set(SECTIONS)
    if unknown:
        raise SystemExit(f"--sections: unknown {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    for section in list(wanted):
        wanted.update(NEEDS.get(section, ()))
    return [s for s in SECTIONS if s in wanted]


def default_peak_flops(device) -> float | None:
    kind = device.device_kind.lower()
    if device.platform == "cpu":
        return None
    return next((tflops * 1e12 for key, tflops in PEAK_TFLOPS if key in kind), None)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="experiments/bench.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--preset",
        choices=list(PRESETS),
        default="quick",
        help="smoke: test-sized; quick: CPU-sized SmolLM2; full: SmolLM2-135M shapes, bf16",
    )
    parser.add_argument(
        "--sections", default=",".join(SECTIONS), help="comma-separated subset of " + ",".join(SECTIONS)
    )
    parser.add_argument(
        "--out_dir", default="runs/bench", help="where bench_<preset>.json and .md are written"
    )
    parser.add_argument("--repeats", type=int, help="timed repetitions per variant (default: the preset's)")
    parser.add_argument("--decode_lengths", type=_ints, help="generated tokens, e.g. 512,1024,2048")
    parser.add_argument("--decode_batches", type=_ints, help="decode batch sizes, e.g. 1,8")
    parser.add_argument(
        "--peak_tflops",
        type=float,
        help="peak TFLOP/s per chip for MFU (default by device kind: H100/H200 989, v5e 197, "
        "v5p 459; CPU: none)",
    )
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    sections = resolve_sections(args.sections)
    overrides = {
        k: getattr(args, k)
        for k in ("repeats", "decode_lengths", "decode_batches")
        if getattr(args, k) is not None
    }
    preset = dataclasses.replace(PRESETS[args.preset], **overrides)
    peak = default_peak_flops(jax.devices()[0]) if args.peak_tflops is None else args.peak_tflops * 1e12
    bench = Bench(preset, matched_baseline(preset.model), peak, args.seed)
    started = time.perf_counter()
    for name in tqdm(sections, desc="sections", file=sys.stderr):
        section_start = time.perf_counter()
        bench.results[name] = SECTION_FNS[name](bench)
        bench.results[name]["wall_seconds"] = time.perf_counter() - section_start
    meta = {**metadata(args.preset, bench, argv), "wall_seconds": time.perf_counter() - started}
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    markdown = render(meta, bench.results)
    (out_dir / f"bench_{args.preset}.md").write_text(markdown)
    payload = {
        "meta": meta,
        "sections": {k: {f: v for f, v in s.items() if f != "markdown"} for k, s in bench.results.items()},
    }
    (out_dir / f"bench_{args.preset}.json").write_text(json.dumps(payload, indent=1))
    print(markdown)
    return payload


if __name__ == "__main__":
    main()
