"""Prefill (the paper's Table 8): Jacobi prefill with D passes against exact sequential prefill, its
speed-up and how far its logits and loss are from exact."""

import jax
import jax.numpy as jnp
import optax

from t2mlr_jax.architectures.t2mlr.recurrence import exact_forward, jacobi_forward
from t2mlr_jax.model.backbone import init_cache
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.studies.benchmarks.harness import (
    Bench,
    measure_interleaved,
    median,
    median_ratio,
    progress,
    random_tokens,
)
from t2mlr_jax.studies.benchmarks.presets import inference_config
from t2mlr_jax.studies.benchmarks.report import layers, markdown_table, ms, times

TITLE = "Prefill (Table 8)"
# Table 8: Jacobi prefill speed-up over exact, by range and D.
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


def with_gammas(params: dict, gamma: float) -> dict:
    """Every ReZero gamma set to `gamma`: at their initial zero the recurrence would not change the logits."""
    mixer = {
        k: jnp.full_like(v, gamma) if k.startswith("rezero_gamma") else v for k, v in params["mixer"].items()
    }
    return {**params, "mixer": mixer}


def _prefill_fn(cfg: ModelConfig, depth: int | None, batch: int, seq: int):
    """The prompt forward as generate() runs it (logits, next-token R, filled KV cache);
    depth None = exact."""

    def prefill(params, tokens):
        cache = init_cache(cfg, batch, seq)
        if depth is None:
            out = exact_forward(cfg, params, tokens, cache=cache)
        else:
            out = jacobi_forward(cfg, params, tokens, cache=cache, d_forward=depth, d_backward=0)
        return out.logits, out.recurrent_state, out.cache

    return jax.jit(prefill)


@jax.jit
def _deviation(logits, exact_logits, tokens):
    def loss(x):
        return optax.softmax_cross_entropy_with_integer_labels(x[:, :-1], tokens[:, 1:]).mean()

    return (
        jnp.abs(logits - exact_logits).max(),
        loss(logits) - loss(exact_logits),
        jnp.abs(exact_logits).max(),
    )


def run(bench: Bench) -> dict:
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
        f"Prefill of {p.prefill_batch} x {p.prefill_seq} random tokens (logits, R and KV cache) by Jacobi "
        "with D passes vs exact sequential prefill.",
        f"Deviation on a random-init model with every gamma set to {p.prefill_gamma} so that the recurrence "
        "changes the logits: it shows how far Jacobi is from exact, not the task-quality gap of Table 8 "
        "(that needs a trained model). Jacobi is exact at positions < D, so everywhere when D >= prompt "
        "length.",
    ]
    return {"rows": rows, "markdown": table, "notes": notes}
