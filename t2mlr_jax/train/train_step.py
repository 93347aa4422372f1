"""The training state and the one jitted train step.

`compile_step` is the only place a step is jitted: the state is donated, and a mesh (with state and batch
shardings) can be passed without touching the step itself. Gradient accumulation splits the batch into
`grad_accum` micro-batches under a `lax.scan`; the loss is the token-weighted mean over the whole batch,
so accumulation changes memory, not the update.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, Float, Int

from t2mlr_jax.model.fusion import RECURRENT
from t2mlr_jax.model.recurrence import Layout
from t2mlr_jax.train.architecture import Architecture

MODEL_INPUTS = ("tokens", "targets", "loss_mask", "positions", "segment_ids", "control_flow")


class TrainState(NamedTuple):
    step: Int[Array, ""]
    params: Any
    opt_state: Any
    rng: Any  # raw uint32 key data, so checkpoints need no typed-key handler


def init_state(
    arch: Architecture, optimizer: optax.GradientTransformation, seed: int, loaded: dict | None = None
) -> TrainState:
    """The state at step 0. `loaded` (arch.pretrained, already on device) replaces the fresh entries of the same
    name; passed as an argument, not closed over, so it is not compiled into the function as constants, and
    under jit the draws it replaces are never computed."""
    init_key, rng = jax.random.split(jax.random.PRNGKey(seed))
    params = {**arch.init(init_key), **(loaded or {})}
    return TrainState(jnp.zeros((), jnp.int32), params, optimizer.init(params), rng)


def model_inputs(batch: dict) -> dict:
    """The batch-contract arrays a step consumes (extra metadata such as length bins stays outside)."""
    missing = [k for k in MODEL_INPUTS if k not in batch]
    if missing:
        raise KeyError(f"batch lacks {missing}; a batch needs {MODEL_INPUTS}")
    return {k: batch[k] for k in MODEL_INPUTS}


def layout_of(batch: dict) -> Layout:
    return Layout(batch["positions"], batch["segment_ids"], batch["control_flow"])


def token_stats(logits: Float[Array, "B T V"], batch: dict) -> dict:
    """Per-row sums over supervised positions: loss, token count, correct argmax predictions."""
    mask = batch["loss_mask"].astype(jnp.float32)
    logits = logits.astype(jnp.float32)
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])
    correct = (jnp.argmax(logits, axis=-1) == batch["targets"]).astype(jnp.float32)
    return {"loss_sum": (nll * mask).sum(-1), "tokens": mask.sum(-1), "correct": (correct * mask).sum(-1)}


def gate_means(gate_stats: dict, control_flow: Int[Array, "B T"]) -> dict:
    """Sum of each per-token gate activation over recurrent positions, and how many there were."""
    recurrent = (control_flow >= RECURRENT).astype(jnp.float32)
    sums = {f"gate/{k}": (v.astype(jnp.float32) * recurrent).sum() for k, v in gate_stats.items()}
    return {**sums, "gate/positions": recurrent.sum()} if sums else {}


def _micro_batches(batch: dict, n: int) -> dict:
    b = batch["tokens"].shape[0]
    if b % n:
        raise ValueError(f"batch size {b} is not divisible by grad_accum {n}")
    return jax.tree.map(lambda a: a.reshape(n, b // n, *a.shape[1:]), batch)


def make_train_step(
    arch: Architecture,
    optimizer: optax.GradientTransformation,
    schedule: optax.Schedule,
    grad_accum: int = 1,
    d_forward: int | None = None,
) -> Callable[[TrainState, dict], tuple[TrainState, dict]]:
    """The un-jitted step (state, batch) -> (state, metrics); see `compile_step`. `d_forward` overrides the
    model's Jacobi depth D."""

    def loss_fn(params, mb):
        logits, gates = arch.apply(params, mb["tokens"], layout_of(mb), True, d_forward)
        sums = jax.tree.map(jnp.sum, token_stats(logits, mb))
        return sums["loss_sum"], {**sums, **gate_means(gates, mb["control_flow"])}

    grad_fn = jax.grad(loss_fn, has_aux=True)

    def step(state: TrainState, batch: dict) -> tuple[TrainState, dict]:
        def accumulate(acc, mb):
            grads, aux = grad_fn(state.params, mb)
            return jax.tree.map(jnp.add, acc, (grads, aux)), None

        micro = _micro_batches(batch, grad_accum)
        zeros = jax.tree.map(
            jnp.zeros_like, jax.eval_shape(grad_fn, state.params, jax.tree.map(lambda a: a[0], micro))
        )
        (grads, sums), _ = jax.lax.scan(accumulate, zeros, micro)
        tokens = jnp.maximum(sums["tokens"], 1.0)
        grads = jax.tree.map(lambda g: g / tokens, grads)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {
            "loss": sums["loss_sum"] / tokens,
            "accuracy": sums["correct"] / tokens,
            "tokens": sums["tokens"],
            "grad_norm": optax.tree.norm(grads),
            "lr": schedule(state.step),
            **{
                k: v / jnp.maximum(sums["gate/positions"], 1.0)
                for k, v in sums.items()
                if k.startswith("gate/") and k != "gate/positions"
            },
            **arch.gamma_stats(params),
        }
        return TrainState(state.step + 1, params, opt_state, state.rng), metrics

    return step


def compile_step(
    arch: Architecture,
    optimizer: optax.GradientTransformation,
    schedule: optax.Schedule,
    grad_accum: int = 1,
    *,
    mesh: jax.sharding.Mesh | None = None,
    state_sharding: Any = None,
    batch_sharding: Any = None,
    d_forward: int | None = None,
) -> Callable[[TrainState, dict], tuple[TrainState, dict]]:
    """jit the step with the state donated; with a mesh, in/out shardings place state and batch on it."""
    step = make_train_step(arch, optimizer, schedule, grad_accum, d_forward)
    if mesh is None:
        return jax.jit(step, donate_argnums=0)
    return jax.jit(
        step,
        donate_argnums=0,
        in_shardings=(state_sharding, batch_sharding),
        out_shardings=(state_sharding, None),
    )
