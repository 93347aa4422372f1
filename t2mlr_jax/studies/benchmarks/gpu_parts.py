"""The parts of experiments/gpu_check.py, each run in a process of its own: what each measures, at the GPU's
sizes or the dry run's. A part is a list of units (label, thunk -> rows); the worker runs them in order,
so that one failing unit is one error row and the others still run.

env        the device, versions, peak bf16 FLOP/s and the sizes of this run
attention  einsum / xla / cudnn `attend` (t2mlr_jax.model.layers) against an fp32 einsum reference: equal to
           ATTENTION_RTOL, forward and forward + backward timed
train      the trainer's compiled step (bf16, AdamW, the 135M recipe's remat and layer form) of the
           parameter-matched transformer, T²MLR at Table 12's (13,18) and the LRT at P refinement passes:
           step time, tokens/s, the architectures' FLOP count (flops_per_step) and MFU
decode     generate() of the baseline and T²MLR windows side by side (the bench's decode section, Table 7)
prefill    Jacobi prefill against exact, per window and D (the bench's prefill section, Table 8)
"""

from __future__ import annotations

import dataclasses
import platform
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from t2mlr_jax.architectures import flops_per_step
from t2mlr_jax.config.edit import config_module
from t2mlr_jax.experiment import resolve
from t2mlr_jax.model.layers import AUTO_ATTENTION, CPU_ATTENTION, attend, attention_mask, attention_path
from t2mlr_jax.studies import ROOT
from t2mlr_jax.studies.benchmarks import decode, prefill, presets, throughput
from t2mlr_jax.studies.benchmarks import vs_release_ours as ours
from t2mlr_jax.studies.benchmarks.harness import Bench, median
from t2mlr_jax.studies.benchmarks.report import describe
from t2mlr_jax.studies.benchmarks.side_by_side import timed_calls

CONFIG = ROOT / "configs" / "smollm135m_t2mlr.py"  # the 135M pretraining recipe (bf16, AdamW)
T2MLR_RANGE = "(13,18)"  # Table 12's window, scaled to the model's depth
ATTENTION_IMPLS = ("einsum", "xla", "cudnn")
# max |out - ref| / max |ref| of the output and of each gradient against the fp32 einsum on the same inputs:
# 5x what the bf16 einsum itself is off at the GPU sizes (<= 4.1e-3 on out, dq, dk, dv; measured on a CPU at
# 1 x 2048 tokens), where a wrong mask or scale is off by O(1).
ATTENTION_RTOL = 2e-2


@dataclasses.dataclass(frozen=True)
class Sizes:
    bench: presets.Preset  # the model (dtype included) and the decode / prefill grids of the bench sections
    train_batch: int
    train_seq: int
    lrt_passes: int  # the LRT's refinement passes after pass 0 (training draws 1-4, mean 2)
    attention_batch: int
    attention_seq: int
    attention_repeats: int  # timed calls per attention program (each one call, a few ms on a GPU)


SIZES = {
    # SmolLM2-135M in bf16; the grids cut to about what fits the part budgets of a 10-minute run (a unit
    # with no time left is skipped), most wanted first.
    "gpu": Sizes(
        bench=dataclasses.replace(
            presets.PRESETS["full"],
            repeats=3,
            decode_ranges=("(1,30)", "(5,26)", "(9,22)"),  # Table 7's; each length compiles each anew
            decode_lengths=(512, 1024),
            decode_batches=(1,),
            prefill_ranges=("(5,26)", "(13,18)", "(9,22)"),
        ),
        # Half the recipe's micro-batch (256 rows, grad_accum 8): T²MLR's step, estimated, ~60 GB.
        train_batch=16,
        train_seq=2048,
        lrt_passes=2,
        attention_batch=8,
        attention_seq=2048,
        attention_repeats=20,
    ),
    # The bench's test-sized model at 2 layers, bf16 as on the GPU: every part runs, its timings mean nothing.
    "dry": Sizes(
        bench=dataclasses.replace(
            presets.PRESETS["smoke"],
            model=presets.PRESETS["smoke"].model.replace(num_layers=2, dtype="bfloat16"),
            repeats=1,
        ),
        train_batch=2,
        train_seq=16,
        lrt_passes=1,
        attention_batch=1,
        attention_seq=32,
        attention_repeats=2,
    ),
}


class Part(NamedTuple):
    units: list[tuple[str, Callable[[], list[dict]]]]
    summary: Callable[[list[dict]], dict] | None = None  # over every row, once the units have run


def sizes_row(sizes: Sizes) -> dict:
    b = sizes.bench
    return {
        "model": describe(b.model),
        "train": f"batch {sizes.train_batch} x {sizes.train_seq}, Jacobi D={b.d_forward} B={b.d_backward}, "
        f"LRT P={sizes.lrt_passes}, {b.repeats} timed steps",
        "attention": f"batch {sizes.attention_batch} x {sizes.attention_seq}, "
        f"{sizes.attention_repeats} timed calls",
        "decode": f"ranges {b.decode_ranges}, batches {b.decode_batches}, new tokens {b.decode_lengths}",
        "prefill": f"ranges {b.prefill_ranges}, D {b.prefill_depths}, batch {b.prefill_batch} x "
        f"{b.prefill_seq}",
    }


def env(sizes: Sizes) -> Part:
    def device() -> list[dict]:
        d = jax.devices()[0]
        stats = d.memory_stats() or {}
        return [
            {
                "case": "device",
                "platform": d.platform,
                "device_kind": d.device_kind,
                "device_count": jax.device_count(),
                "memory_bytes": stats.get("bytes_limit"),
                "peak_flops": throughput.default_peak_flops(d),
                "auto_attention": AUTO_ATTENTION.get(d.platform, CPU_ATTENTION),
                "jax": jax.__version__,
                "python": platform.python_version(),
                "sizes": sizes_row(sizes),
                "environment": jax.print_environment_info(return_string=True),
            }
        ]

    return Part([("device", device)])


def _rel_err(got, want) -> float:
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    return float(np.abs(got - want).max() / np.abs(want).max())


def attention(sizes: Sizes) -> Part:
    m, b, t = sizes.bench.model, sizes.attention_batch, sizes.attention_seq
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    dtype = jnp.dtype(m.dtype)
    q = jax.random.normal(keys[0], (b, t, m.num_heads, m.head_dim), dtype)
    k, v = (jax.random.normal(key, (b, t, m.num_kv_heads, m.head_dim), dtype) for key in keys[1:3])
    g = jax.random.normal(keys[3], q.shape, dtype)  # the cotangent of the output
    ones, slots = jnp.ones((b, t), jnp.int32), jnp.broadcast_to(jnp.arange(t), (b, t))
    mask = attention_mask(ones, ones, slots, slots)  # causal, one document per row

    def programs(impl: str):
        forward = jax.jit(lambda q, k, v: attend(q, k, v, mask, impl=impl))

        @jax.jit
        def forward_backward(q, k, v, g):
            out, vjp = jax.vjp(lambda *qkv: attend(*qkv, mask, impl=impl), q, k, v)
            return out, vjp(g)

        return forward, forward_backward

    upcast = [x.astype(jnp.float32) for x in (q, k, v, g)]
    ref_out, ref_grads = programs("einsum")[1](*upcast)

    def unit(impl: str) -> list[dict]:
        try:
            path = attention_path(impl, q, k, None)
        except ValueError as e:  # a kernel of another platform: cudnn on a CPU
            return [{"case": impl, "skipped": str(e)}]
        forward, forward_backward = programs(impl)
        out, grads = forward_backward(q, k, v, g)
        errors = {"out": _rel_err(out, ref_out)}
        errors.update({name: _rel_err(x, y) for name, x, y in zip(("dq", "dk", "dv"), grads, ref_grads)})
        wait, n = jax.block_until_ready, sizes.attention_repeats
        fwd_s, _ = timed_calls(lambda: forward(q, k, v), n, wait)
        fwd_bwd_s, _ = timed_calls(lambda: forward_backward(q, k, v, g), n, wait)
        return [
            {
                "case": impl,
                "ran_as": path,
                "dtype": str(dtype),
                "shape_bthke": [b, t, m.num_heads, m.num_kv_heads, m.head_dim],
                "fwd_ms": 1e3 * median(fwd_s),
                "fwd_bwd_ms": 1e3 * median(fwd_bwd_s),
                "max_rel_err": errors,
                "tolerance": ATTENTION_RTOL,
                "within_tolerance": max(errors.values()) <= ATTENTION_RTOL,
            }
        ]

    def summary(rows: list[dict]) -> dict:
        timed = {r["case"]: r for r in rows if "fwd_ms" in r}
        base = timed.get("einsum")
        return {
            "all_within_tolerance": all(r["within_tolerance"] for r in timed.values()),
            "speedup_over_einsum": base
            and {
                name: {p: base[f"{p}_ms"] / r[f"{p}_ms"] for p in ("fwd", "fwd_bwd")}
                for name, r in timed.items()
            },
        }

    return Part([(impl, lambda impl=impl: unit(impl)) for impl in ATTENTION_IMPLS], summary)


def train_config(sizes: Sizes):
    """The 135M recipe on the sizes' model and rows (what flops_per_step multiplies): T²MLR at T2MLR_RANGE
    scaled to its depth, Jacobi D / B of the sizes, the LRT at a fixed P."""
    c = config_module(CONFIG).get_config()
    model, bench = sizes.bench.model, sizes.bench
    c.model.update({f: getattr(model, f) for f in ours.MODEL_FIELDS}, dtype=model.dtype)
    l_start, l_end = presets.code_range(T2MLR_RANGE, model.num_layers)
    c.model.recurrence.update(
        l_start=l_start, l_end=l_end, d_forward=bench.d_forward, d_backward=bench.d_backward
    )
    c.lrt.passes, c.lrt.pass_probs = (sizes.lrt_passes,), (1.0,)
    c.train.update(batch_size=sizes.train_batch, grad_accum=1)
    c.data.seq_len = sizes.train_seq
    return c


def train(sizes: Sizes) -> Part:
    peak = throughput.default_peak_flops(jax.devices()[0])
    m, rows, seq = sizes.bench.model, sizes.train_batch, sizes.train_seq
    ids = np.random.default_rng(0).integers(1, m.vocab_size, (rows, seq + 1))
    example = jax.ShapeDtypeStruct((rows, seq, m.num_heads, m.head_dim), jnp.dtype(m.dtype))
    cases = {
        "transformer": "transformer",
        f"t2mlr {T2MLR_RANGE}": "t2mlr",
        f"lrt P={sizes.lrt_passes}": "lrt",
    }

    def unit(label: str, arch_name: str) -> list[dict]:
        c = train_config(sizes)
        arch, state, batch, jitted = ours.train_step_of(c, arch_name, ids, 0)
        step, compile_s = ours.compiled(jitted, state, batch)

        def call():
            nonlocal state
            state, metrics = step(state, batch)  # the state is donated
            return metrics["loss"]

        seconds, loss = timed_calls(call, sizes.bench.repeats, jax.block_until_ready)
        flops, s = flops_per_step(resolve(c), arch), median(seconds)
        return [
            {
                "case": label,
                "arch": arch_name,
                "params": arch.num_params(),
                "tokens_per_step": rows * seq,
                "attention": attention_path(c.model.attention_impl, example, example, None),
                "remat": c.model.remat,
                "compile_s": compile_s,
                "step_ms": 1e3 * s,
                "step_ms_all": [1e3 * x for x in seconds],
                "tokens_per_s": rows * seq / s,
                "flops_per_step": flops,
                "tflops_per_s": flops / s / 1e12,
                "mfu": None if peak is None else flops / s / peak,
                "loss": float(loss),
            }
        ]

    def summary(rows: list[dict]) -> dict:
        timed = {r["case"]: r for r in rows if "step_ms" in r}
        base = timed.get("transformer")
        return {
            "peak_flops": peak,
            "over_transformer": base
            and {
                name: {
                    "time": r["step_ms"] / base["step_ms"],
                    "flops": r["flops_per_step"] / base["flops_per_step"],
                }
                for name, r in timed.items()
            },
        }

    return Part([(label, lambda a=(label, name): unit(*a)) for label, name in cases.items()], summary)


def _bench(sizes: Sizes, **preset) -> Bench:
    p = dataclasses.replace(sizes.bench, **preset)
    peak = throughput.default_peak_flops(jax.devices()[0])
    return Bench(p, presets.matched_baseline(p.model), peak, seed=0)


def decode_part(sizes: Sizes) -> Part:
    """One unit per (batch, length): the baseline and every window interleaved (decode.run), with tok/s."""

    def unit(batch: int, n: int) -> list[dict]:
        rows = decode.run(_bench(sizes, decode_batches=(batch,), decode_lengths=(n,)))["rows"]
        return [
            {
                "case": f"b={batch} n={n} {r['range']}",
                **r,
                "tokens_per_s": batch * n / r["seconds"],
                "baseline_tokens_per_s": batch * n / r["baseline_seconds"],
            }
            for r in rows
        ]

    p = sizes.bench
    units = [
        (f"b={b} n={n}", lambda b=b, n=n: unit(b, n)) for n in p.decode_lengths for b in p.decode_batches
    ]
    return Part(units)


def prefill_part(sizes: Sizes) -> Part:
    """One unit per window: exact prefill and Jacobi at every D interleaved (prefill.run)."""

    def unit(r: str) -> list[dict]:
        rows = prefill.run(_bench(sizes, prefill_ranges=(r,)))["rows"]
        return [{"case": f"{r} D={row['d_forward']}", **row} for row in rows]

    return Part([(r, lambda r=r: unit(r)) for r in sizes.bench.prefill_ranges])


PARTS = {"env": env, "attention": attention, "train": train, "decode": decode_part, "prefill": prefill_part}
