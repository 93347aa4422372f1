"""The CPU step-form figures of docs/performance.md, each variant interleaved with the others in
one process (order rotated per repetition, compilation excluded, medians of per-repetition ratios):

1. Layer layout: the trainer's compiled train step (train_step.compile_step, built as
   t2mlr_jax/studies/benchmarks/vs_release_ours.py builds it: fwd + bwd + clipped AdamW, state donated) of the
   plain backbone and of T²MLR, the blocks' weights stacked (model.scan_layers=True) or per layer (False):
   seconds per step, compile seconds, compiled temporaries, and per-layer / stacked.
2. The written-out VJPs of t2mlr_jax.model.layers.rms_norm and .softmax against the same formulas under
   autodiff (jax.nn.softmax's own rule): jitted value_and_grad of sum(out * g) over the model's RMSNorm
   input [B, T, D] and attention logits [B, K, G, T, S], ms per call; it stops unless the gradients agree
   to 1e-5 relative.

Presets: cpu, configs/smollm135m_t2mlr.py:w13_18 (SmolLM2-135M, T²MLR at the paper's (13,18)), fp32, remat
"dots", batch 1 x 256 (four ~1.6 GB train states at once); tiny, the same on a 2-layer 32-wide backbone.
The figures in docs/performance.md are one thread, which is the caller's affinity:

  taskset -c 0 python -m experiments.step_forms --preset=cpu
  python -m experiments.step_forms --preset=tiny --reps=1

Writes results.json (environment, every repetition's seconds) and results.md (the tables, also printed) in
--out (default runs/step_forms_<preset>). Compile seconds are cold unless JAX_COMPILATION_CACHE_DIR is set.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import numpy as np

from t2mlr_jax.config.cli import OneLineParser, fail
from t2mlr_jax.studies.benchmarks import vs_release_ours as ours
from t2mlr_jax.studies.benchmarks.harness import measure_interleaved, median, median_ratio, progress
from t2mlr_jax.studies.benchmarks.report import environment, markdown_table, size, times

COMMAND = "python -m experiments.step_forms"
PRESETS = {  # model overrides over ours.config(), tokens per row, calls per timed VJP repetition
    "cpu": {"model": {}, "recurrence": {}, "seq": 256, "calls": 20},
    "tiny": {  # compile-bound (T²MLR's step ~3 s): 2 layers, the recurrence over the second, D=2, B=1
        "model": dict(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8)
        | {"mlp_dim": 64, "max_seq_len": 64},
        "recurrence": dict(l_start=1, l_end=1, d_forward=2, d_backward=1),
        "seq": 16,
        "calls": 2,
    },
}
LAYOUTS = {"stacked": True, "per_layer": False}  # name -> model.scan_layers
# Two formulas of one op's gradient, relative to the largest: a few fp32 operations apart per element (~10 u,
# u = 2^-24) plus their sums' orders (over the hidden size, and the norm weight's over the row's tokens: n u
# of the terms' magnitudes at worst, far less for XLA's tree reductions); 1e-5 = 168 u covers both.
VJP_RTOL = 1e-5


def preset_config(preset: dict):
    """ours.config(): CONFIG in fp32, its transformer the same backbone; remat "dots" as the figures' runs."""
    c = ours.config()
    c.model.update(preset["model"])
    c.model.recurrence.update(preset["recurrence"])
    c.model.remat = "dots"
    return c


def train_step(c, arch_name: str, seq: int, seed: int = 0):
    """The trainer's compiled step on one random row (ours.train_step_of): (a call advancing the donated
    state, compile seconds, the compiled program's temporaries in bytes or None)."""
    ids = np.random.default_rng(seed).integers(1, c.model.vocab_size, (1, seq + 1))
    _, state, batch, jitted = ours.train_step_of(c, arch_name, ids, seed)
    step, compile_s = ours.compiled(jitted, state, batch)
    memory = step.memory_analysis()

    def call():
        nonlocal state
        state, metrics = step(state, batch)
        return metrics["loss"]

    return call, compile_s, None if memory is None else memory.temp_size_in_bytes


def layer_layouts(c, seq: int, reps: int, bar) -> dict:
    runners, rows = {}, {}
    for name, arch_name in ours.ARCHS.items():
        for layout, scan in LAYOUTS.items():
            v = c.copy_and_resolve_references()
            v.model.scan_layers = scan
            runners[name, layout], compile_s, temp = train_step(v, arch_name, seq)
            rows.setdefault(name, {})[layout] = {"compile_s": compile_s, "temp_bytes": temp}
            bar.update()
    seconds = measure_interleaved(runners, reps, bar)
    for name, row in rows.items():
        for layout in LAYOUTS:
            row[layout].update(seconds=median(seconds[name, layout]), seconds_all=seconds[name, layout])
        stacked, apart = row["stacked"], row["per_layer"]
        row["per_layer_over_stacked"] = {
            "seconds": median_ratio(seconds[name, "per_layer"], seconds[name, "stacked"]),
            "compile_s": apart["compile_s"] / stacked["compile_s"],
            "temp_bytes": apart["temp_bytes"] / stacked["temp_bytes"] if stacked["temp_bytes"] else None,
        }
    return rows


def vjps(model, seq: int, calls: int, reps: int, bar) -> dict:
    """Ours against the formula under autodiff; each timed repetition is `calls` calls (a few ms each)."""
    import jax
    import jax.numpy as jnp

    from t2mlr_jax.model import layers

    eps = model.norm_eps  # SmolLM2: norm_offset False, so the weight scales directly (no 1 + w)
    heads = (model.num_kv_heads, model.num_heads // model.num_kv_heads)
    cases = {
        "rms_norm": (
            lambda x, w: layers.rms_norm(x, w, eps, model.norm_offset),
            lambda x, w: x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w,
            [(1, seq, model.hidden_size), (model.hidden_size,)],
        ),
        "softmax": (layers.softmax, lambda x: jax.nn.softmax(x, axis=-1), [(1, *heads, seq, seq)]),
    }
    runners, rows = {}, {}
    for name, (fn_ours, fn_ref, shapes) in cases.items():
        keys = jax.random.split(jax.random.PRNGKey(0), len(shapes) + 1)
        args = [jax.random.normal(k, s) for k, s in zip(keys, shapes)]
        if name == "rms_norm":
            args[1] = 1 + 0.1 * args[1]  # a weight near SmolLM2's ones, not all equal
        g = jax.random.normal(keys[-1], shapes[0])  # the cotangent, an argument: not folded into constants
        grads = {}
        for side, fn in (("ours", fn_ours), ("autodiff", fn_ref)):
            loss = lambda args, g, fn=fn: jnp.sum(fn(*args) * g)
            compiled = jax.jit(jax.value_and_grad(loss)).lower(args, g).compile()
            grads[side] = compiled(args, g)[1]
            runners[name, side] = lambda c=compiled, a=args, g=g: [c(a, g) for _ in range(calls)]
        errors = [
            float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))
            for a, b in zip(grads["ours"], grads["autodiff"])
        ]
        assert max(errors) <= VJP_RTOL, f"{name}: gradients differ by {max(errors):.2e} relative"
        rows[name] = {"shape": list(shapes[0]), "max_rel_error": max(errors)}
    seconds = measure_interleaved(runners, reps, bar)
    for name, row in rows.items():
        for side in ("ours", "autodiff"):
            row[f"{side}_ms_all"] = [1e3 * s / calls for s in seconds[name, side]]
            row[f"{side}_ms"] = median(row[f"{side}_ms_all"])
        row["ours_over_autodiff"] = median_ratio(seconds[name, "ours"], seconds[name, "autodiff"])
    return rows


def render(meta: dict, layouts: dict, grads: dict) -> str:
    layout_rows = []
    for name, row in layouts.items():
        for layout in LAYOUTS:
            r, ratio = row[layout], row["per_layer_over_stacked"] if layout == "per_layer" else None
            cells = [f"{r['seconds']:.3f}", f"{r['compile_s']:.1f}", size(r["temp_bytes"] or 0)]
            ratios = [times(ratio and ratio[k], 2) for k in ("seconds", "compile_s", "temp_bytes")]
            layout_rows.append([name, layout.replace("_", "-"), *cells, *ratios])
    vjp_rows = [
        [name, "×".join(map(str, r["shape"])), f"{r['ours_ms']:.3f}", f"{r['autodiff_ms']:.3f}"]
        + [times(r["ours_over_autodiff"], 2), f"{r['max_rel_error']:.1e}"]
        for name, r in grads.items()
    ]
    header = ["model", "layers", "s / step", "compile s", "temporaries", "step ×", "compile ×", "temps ×"]
    return "\n".join(
        [
            f"# Step forms ({meta['preset']})",
            "",
            f"`{meta['command']}` on {meta['device']}, jax {meta['jax']}, {meta['reps']} interleaved "
            f"repetitions; {meta['config']}, fp32, remat dots, batch 1 × {meta['seq']}.",
            "",
            "## Layer layout (train step: fwd + bwd + AdamW; × = per-layer / stacked)",
            "",
            markdown_table(header, layout_rows),
            "",
            f"## RMSNorm and softmax, fwd + bwd (jitted value_and_grad; ms per call, {meta['calls']} calls "
            "per repetition)",
            "",
            markdown_table(
                ["function", "shape", "ours ms", "autodiff ms", "ours / autodiff", "grad diff"], vjp_rows
            ),
        ]
    )


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    parser = OneLineParser(prog=COMMAND, description=__doc__)
    parser.add_argument("--preset", choices=list(PRESETS), default="cpu", help="the shapes (see above)")
    parser.add_argument("--out", help="output directory (default runs/step_forms_<preset>)")
    parser.add_argument("--reps", type=int, default=5, help="timed repetitions (rounds of every variant)")
    args = parser.parse_args(argv)
    if args.reps < 1:
        fail(f"--reps must be >= 1, got {args.reps}")
    out = Path(args.out or f"runs/step_forms_{args.preset}")
    preset = PRESETS[args.preset]
    warnings.filterwarnings("ignore", message="Some donated buffers were not usable")  # a CPU cannot donate
    c = preset_config(preset)
    with progress("step forms", 4 + 8 * (args.reps + 1)) as bar:  # 4 compiles, then 8 timed variants
        layouts = layer_layouts(c, preset["seq"], args.reps, bar)
        grads = vjps(c.model, preset["seq"], preset["calls"], args.reps, bar)
    meta = {**environment(args.preset, COMMAND, argv), "config": ours.CONFIG, "reps": args.reps}
    meta.update(seq=preset["seq"], calls=preset["calls"], model_overrides=preset["model"])
    results = {"meta": meta, "layouts": layouts, "vjps": grads}
    markdown = render(meta, layouts, grads)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "results.md").write_text(markdown + "\n")
    print(markdown)
    return results
