"""Our side of experiments/vs_release.py, run in a process of its own (so that its peak RSS is its own): the
framework's SmolLM2-135M T²MLR (CONFIG at the paper's window (13,18), fp32, random init) and the same
backbone without recurrence (arch transformer, not widened), each timed through the trainer's own compiled
step (t2mlr_jax.train.train_step.compile_step) over weights held per layer (model.scan_layers=False),
and the architecture's cached generate, compiled ahead of time and timed apart; prints one JSON line
(see `main`). The parent builds its spec from `config()` / `spec_of()`, so that the release's driver
gets the same shapes and settings.

  python -m experiments.benchmarks.vs_release_ours '<spec json>'
"""

from __future__ import annotations

import time
from pathlib import Path

from t2mlr_jax import cpu_runtime
from t2mlr_jax.config.edit import config_module
from t2mlr_jax.experiment import resolve
from t2mlr_jax.studies import ROOT
from t2mlr_jax.studies.benchmarks.side_by_side import pin_threads, result, timed_calls
from t2mlr_jax.train.profiling import trace_calls

ENTRY_POINT = "experiments.benchmarks.vs_release_ours"  # its command: python -m ENTRY_POINT
CONFIG = "configs/smollm135m_t2mlr.py:w13_18"  # the paper's (13,18): code l_start 12, l_end 17; D 16, B 4
TITLE = "T²MLR: this framework vs the authors' release"
ARCHS = {"t2mlr": "t2mlr", "plain": "transformer"}  # row prefix -> architecture
MODELS = {"t2mlr": "T²MLR", "plain": "plain"}  # row prefix -> label
TRAIN = {"batch": 1, "seq_len": 256}
DECODE = {"batch": 1, "prompt_len": 16}
MODEL_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "mlp_dim",
    "rope_theta",
    "norm_eps",
    "tie_embeddings",
    "init_std",
    "max_seq_len",
)
RECURRENCE_FIELDS = (
    "l_start",
    "l_end",
    "d_forward",
    "d_backward",
    "gate_weight_init_std",
    "temporal_residual",
    "temporal_residual_weight",
    "cache_norm_clamp",
)


def config():
    """CONFIG in fp32, whose transformer baseline is the same backbone (no parameter matching), with the
    blocks' weights held per layer (model.scan_layers=False), as the release's modules hold them: the
    form a CPU steps fastest in, at 3-4x the compile time (docs/performance.md)."""
    path, _, preset = CONFIG.partition(":")
    c = config_module(ROOT / path).get_config(preset)
    c.model.dtype = "float32"
    c.model.scan_layers = False
    c.baseline.param_match = False
    return c


OPTIMIZER_FIELDS = ("lr", "grad_clip")  # the spec's optimizer: these on optimizer ...
ADAMW_FIELDS = ("b1", "b2", "eps", "weight_decay")  # ... and these on optimizer.adamw


def spec_of(c) -> dict:
    """What both drivers build from: the backbone's shapes, the recurrence, the optimizer. The release's
    driver mirrors only the gated mixer with W_rec and the rescale cache norm (fixed there)."""
    r = c.model.recurrence
    if (r.mixer, r.recurrent_projection, r.cache_norm) != ("gated", True, "rescale"):
        raise ValueError(f"{CONFIG}: the release driver mirrors only the gated mixer with the rescale cache")
    return {
        "model": {k: c.model[k] for k in MODEL_FIELDS},
        "recurrence": {k: r[k] for k in RECURRENCE_FIELDS},
        "optimizer": {
            **{k: c.optimizer[k] for k in OPTIMIZER_FIELDS},
            **{k: c.optimizer.adamw[k] for k in ADAMW_FIELDS},
        },
    }


def set_optimizer(c, optimizer: dict) -> None:
    """The spec's optimizer (spec_of's) into config `c`: lr and clipping on optimizer, the rest on
    optimizer.adamw."""
    c.optimizer.update({k: optimizer[k] for k in OPTIMIZER_FIELDS})
    c.optimizer.adamw.update({k: optimizer[k] for k in ADAMW_FIELDS})


def model_spec() -> dict:
    return spec_of(config())


def setting(spec: dict) -> str:
    m, r = spec["model"], spec["recurrence"]
    return (
        f"{m['num_layers']} layers x {m['hidden_size']}, code l_start {r['l_start']}, l_end {r['l_end']}, "
        f"gated mixer, Jacobi D {r['d_forward']}, B {r['d_backward']}, "
        f"temporal residual {'on' if r['temporal_residual'] else 'off'}"
    )


def details(spec: dict) -> dict[str, str]:
    t, d = spec["train"], spec["decode"]
    new = d["new_tokens"]
    return {
        "t2mlr_train": f" (fwd + bwd + AdamW, {t['batch']} × {t['seq_len']} tokens)",
        "plain_train": " (same backbone, no recurrence)",
        "t2mlr_decode": f", batch {d['batch']}, {d['prompt_len']}-token prompt + {new} new (tok/s)",
        "plain_decode": " (tok/s)",
    }


def tokens(spec: dict, slots: int = 1):
    """The rows both sides train on and prompt with (the same numpy draw as the release's driver); with
    `slots` per token (a thought model's K + 1), rows of slots x seq_len, whose first seq_len tokens are
    what it trains on (thought_slots.vocabulary_prefix): the release's row, when the batch is one row."""
    import numpy as np

    shape = (max(spec["train"]["batch"], spec["decode"]["batch"]), slots * spec["train"]["seq_len"] + 1)
    return np.random.default_rng(spec["seed"]).integers(1, spec["model"]["vocab_size"], shape)


def compiled(jitted, *args) -> tuple:
    """(the compiled function, seconds to lower and compile it)."""
    start = time.perf_counter()
    fn = jitted.lower(*args).compile()
    return fn, time.perf_counter() - start


def step_of(c, arch_name: str) -> tuple:
    """(architecture, optimizer, the trainer's own jitted step: forward + backward + clipped AdamW update)."""
    from t2mlr_jax.architectures import build_architecture
    from t2mlr_jax.train.optimizer import make_optimizer, make_schedule
    from t2mlr_jax.train.train_step import compile_step

    arch = build_architecture(resolve(c), arch_name)
    optimizer = make_optimizer(resolve(c).optimizer, arch.specs, c.train.steps)
    return arch, optimizer, compile_step(arch, optimizer, make_schedule(resolve(c).optimizer, c.train.steps))


def lm_batch(ids) -> dict:
    """The rows `ids` [B, T + 1] as a train batch, each one recurrent document (as pretraining)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from t2mlr_jax.train.train_step import model_inputs

    ids = np.asarray(ids, np.int32)
    shape = (ids.shape[0], ids.shape[1] - 1)
    batch = model_inputs(
        {
            "tokens": ids[:, :-1],
            "targets": ids[:, 1:],  # position-aligned next tokens
            "loss_mask": np.ones(shape, np.float32),
            "positions": np.broadcast_to(np.arange(shape[1], dtype=np.int32), shape),
            "segment_ids": np.ones(shape, np.int32),
            "control_flow": np.full(shape, 2, np.int32),  # 2 = recurrent (pretraining)
        }
    )
    return jax.tree.map(jnp.asarray, batch)


def train_step_of(c, arch_name: str, ids, seed: int) -> tuple:
    """(architecture, initial state, batch, the trainer's own jitted step) on the rows `ids` [B, T + 1]."""
    from t2mlr_jax.train.train_step import init_state

    arch, optimizer, step = step_of(c, arch_name)
    return arch, init_state(arch, optimizer, seed), lm_batch(ids), step


def measure(c, arch_name: str, spec: dict, name: str, slots: int = 1) -> dict:
    """One architecture's train step (`step_of`) on rows of `slots` x seq_len slots (`tokens`) and
    greedy generate() (exact prefill of a recurrent prompt, then cached single-token steps); with the spec's
    profile window, its train step's trace in profile_dir/<name>_train."""
    import jax
    import jax.numpy as jnp

    from t2mlr_jax.model.backbone import unstack_layers
    from t2mlr_jax.train.train_step import init_state

    rows, t, d = tokens(spec, slots), spec["train"], spec["decode"]
    arch, optimizer, jitted = step_of(c, arch_name)
    batch = lm_batch(rows[: t["batch"]])
    # compiled from the state's shapes before the state exists: the compiler's scratch and the state are
    # not resident together (the peak RSS)
    abstract = jax.eval_shape(lambda: init_state(arch, optimizer, spec["seed"]))
    step, train_compile = compiled(jitted, abstract, batch)
    state = init_state(arch, optimizer, spec["seed"])

    def train_step():
        nonlocal state
        state, metrics = step(state, batch)  # the state is donated
        return metrics["loss"]

    train_seconds, loss = timed_calls(train_step, spec["repeats"], jax.block_until_ready)
    if spec.get("profile"):
        trace_calls(train_step, tuple(spec["profile"]), Path(spec["profile_dir"]) / f"{name}_train")
    n = d["new_tokens"]
    prompt = jnp.asarray(rows[: d["batch"], : d["prompt_len"]], jnp.int32)
    # In the compute dtype once (the state holds fp32 masters): no generate() call casts or copies a weight.
    # The optimizer state goes first and the params are donated, so the decode weights do not sit beside
    # the train state.
    params, state = state.params, None
    weights = jax.jit(unstack_layers, static_argnums=0, donate_argnums=1)(arch.backbone, params)
    del params
    decode_args = (weights, prompt, jnp.ones_like(prompt), jnp.full_like(prompt, 2))
    model_state = arch.init_model_state()
    generate = jax.jit(
        lambda p, x, mask, flow: arch.generate(p, model_state, x, mask, flow, n, None, 0).tokens
    )
    generate, decode_compile = compiled(generate, *decode_args)
    decode_seconds, _ = timed_calls(lambda: generate(*decode_args), spec["repeats"], jax.block_until_ready)
    params = arch.num_params()
    return {
        "train": {
            "seconds": train_seconds,
            "compile_s": train_compile,
            "loss": float(loss),
            "params": params,
        },
        "decode": {"seconds": decode_seconds, "compile_s": decode_compile, "new_tokens": n, "params": params},
    }


def measure_all(spec: dict, models) -> dict:
    """Our driver's JSON line (side_by_side.result) for `models(spec)`: {row prefix: (config, architecture,
    slots per token)}, called once the threads are pinned (before jax starts)."""
    start = time.perf_counter()
    pin_threads(spec["threads"])  # XLA sizes its CPU thread pools by the affinity
    import warnings

    import jax

    warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
    programs = {}
    for name, (c, arch_name, slots) in models(spec).items():
        cpu_runtime.hand_back()  # the previous row's leftovers do not lift this row's peak
        measured = measure(c, arch_name, spec, name, slots)
        programs[f"{name}_train"], programs[f"{name}_decode"] = measured["train"], measured["decode"]
    return result("ours", {"jax": jax.__version__, "device": jax.devices()[0].device_kind}, programs, start)


def models_of(spec: dict) -> dict:
    """CONFIG under the spec (it rules, as it does the release's driver), as T²MLR and as the backbone."""
    c = config()
    c.model.update(spec["model"])
    set_optimizer(c, spec["optimizer"])
    c.model.recurrence.update(spec["recurrence"])
    return {name: (c, arch_name, 1) for name, arch_name in ARCHS.items()}


def main(spec: dict) -> dict:
    """{"side", "versions", "programs", "peak_rss_bytes", "wall_s"}; programs: t2mlr_train, t2mlr_decode,
    plain_train, plain_decode, each {"seconds": [...], "compile_s", "params", ...}."""
    return measure_all(spec, models_of)
