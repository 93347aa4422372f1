"""The training state and the one jitted train step, over any `Architecture` (t2mlr_jax.architectures).

`compile_step` is the only place a step is jitted: the state is donated, and a mesh (with state and batch
shardings) can be passed without touching the step itself. Gradient accumulation splits the batch into
`grad_accum` micro-batches under a `lax.scan`; the loss is the token-weighted mean over the whole batch,
so accumulation changes memory, not the update. After the optimizer update, the architecture's
non-gradient state is updated from the statistics its forward reported (e.g. MoE routing balance).
With `update_sharding` (a params-shaped tree of shardings: `placement.update_shardings`) the gradients are
reduced into it and the update is computed there, however the params themselves are laid out (ZeRO-1:
gradients reduce-scattered to the optimizer state's shards, the new weights all-gathered by the step's
output sharding).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Hashable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, Int

from t2mlr_jax.architectures import Architecture

MODEL_INPUTS = ("tokens", "targets", "loss_mask", "positions", "segment_ids", "control_flow")
OPTIONAL_MODEL_INPUTS = ("target_bytes",)  # passed on when the batch has them (the loss then reports bpb)


class TrainState(NamedTuple):
    step: Int[Array, ""]
    params: Any
    opt_state: Any
    rng: Any  # raw uint32 key data, so checkpoints need no typed-key handler
    model_state: Any  # state updated without gradients (`Architecture.update_model_state`)


def init_state(
    arch: Architecture, optimizer: optax.GradientTransformation, seed: int, loaded: dict | None = None
) -> TrainState:
    """The state at step 0. `loaded` (config.init_from's weights, already on device) replaces the fresh
    entries of the same name; passed as an argument, not closed over, so it is not compiled into the
    function as constants, and under jit the draws it replaces are never computed."""
    init_key, rng = jax.random.split(jax.random.PRNGKey(seed))
    params = {**arch.init(init_key), **(loaded or {})}
    return TrainState(jnp.zeros((), jnp.int32), params, optimizer.init(params), rng, arch.init_model_state())


def model_inputs(batch: dict) -> dict:
    """The batch-contract arrays a step consumes: MODEL_INPUTS, plus OPTIONAL_MODEL_INPUTS the batch has
    (extra metadata such as length bins stays outside)."""
    missing = [k for k in MODEL_INPUTS if k not in batch]
    if missing:
        raise KeyError(f"batch lacks {missing}; a batch needs {MODEL_INPUTS}")
    return {k: batch[k] for k in MODEL_INPUTS + OPTIONAL_MODEL_INPUTS if k in batch}


def _micro_batches(batch: dict, n: int) -> dict:
    b = batch["tokens"].shape[0]
    if b % n:
        raise ValueError(f"batch size {b} is not divisible by grad_accum {n}")
    return jax.tree.map(lambda a: a.reshape(n, b // n, *a.shape[1:]), batch)


def _means(sums: dict) -> dict:
    return {name: total / jnp.maximum(count, 1.0) for name, (total, count) in sums.items()}


def make_grad_fn(arch: Architecture, sample: Hashable | None = None, mean: bool = False) -> Callable:
    """(params, batch, model_state, rng) -> (gradient of the summed training loss, (metric sums, stats)):
    the training forward's gradient, un-normalised (the step divides by the batch's tokens), or with
    `mean` the gradient of the batch's mean loss: the division then scales the backward's scalar seed
    rather than every gradient. `sample` is the step's static choice (`Architecture.sample`, e.g. the
    Jacobi depth D)."""

    def loss_fn(params, mb, model_state, rng):
        out = arch.apply(params, mb, training=True, rng=rng, model_state=model_state, sample=sample)
        sums = arch.loss(out, mb)
        total, count = sums["loss"]
        return (total / jax.lax.stop_gradient(jnp.maximum(count, 1.0)) if mean else total), (sums, out.stats)

    return jax.grad(loss_fn, has_aux=True)


def make_train_step(
    arch: Architecture,
    optimizer: optax.GradientTransformation,
    schedule: optax.Schedule,
    grad_accum: int = 1,
    sample: Hashable | None = None,
    update_sharding: Any = None,
) -> Callable[[TrainState, dict], tuple[TrainState, dict]]:
    """The un-jitted step (state, batch) -> (state, metrics); see `compile_step` and `make_grad_fn`."""
    # One micro-batch: the mean's gradient directly. Several: their sums' gradients, divided by all tokens.
    grad_fn = make_grad_fn(arch, sample, mean=grad_accum == 1)
    where_updated = lambda tree: (
        tree if update_sharding is None else jax.lax.with_sharding_constraint(tree, update_sharding)
    )

    def step(state: TrainState, batch: dict) -> tuple[TrainState, dict]:
        step_key = jax.random.fold_in(state.rng, state.step)

        def micro_grad(i, mb):
            grads, aux = grad_fn(state.params, mb, state.model_state, jax.random.fold_in(step_key, i))
            return where_updated(grads), aux  # each micro-batch's gradient reduced straight to its shards

        def accumulate(acc, xs):
            return jax.tree.map(jnp.add, acc, micro_grad(*xs)), None

        # The first micro-batch starts the sum (rather than zeros shaped by an eval_shape of the gradient):
        # the gradient is traced once per step, not twice, and tracing is most of a small run's start-up.
        micro = _micro_batches(batch, grad_accum)
        acc = micro_grad(0, jax.tree.map(lambda a: a[0], micro))
        if grad_accum > 1:
            rest = jax.tree.map(lambda a: a[1:], micro)
            acc, _ = jax.lax.scan(accumulate, acc, (jnp.arange(1, grad_accum), rest))
        grads, (sums, stats) = acc
        tokens = sums["loss"][1]
        if grad_accum > 1:
            grads = jax.tree.map(lambda g: g / jnp.maximum(tokens, 1.0), grads)
        old_params = where_updated(state.params)  # each device updates its shard of them
        # Each gradient's squared norm, in optax.tree.norm's order: the global norm (the clip's too) and
        # which parameters the step used (skip_unused), from one pass over the gradients.
        sq_norms = jax.tree.map(lambda g: jnp.sum(jnp.square(g)), grads)
        means, grad_norm = _means(sums), jnp.sqrt(jax.tree.reduce(operator.add, sq_norms, initializer=0))
        finite = jnp.isfinite(means["loss"]) & jnp.isfinite(grad_norm)  # a finite update of finite params

        def updated(operands):
            params, opt_state = operands
            updates, opt_state = optimizer.update(
                grads, opt_state, params, grad_norm=grad_norm, grad_sq_norms=sq_norms
            )
            return optax.apply_updates(params, updates), opt_state

        # A non-finite step is not applied (the state only counts it; the trainer stops or skips): one
        # branch on one flag, not a select between old and new over every parameter and moment.
        params, opt_state = jax.lax.cond(
            finite, updated, lambda operands: operands, (old_params, state.opt_state)
        )
        model_state, state_metrics = state.model_state, {}
        if arch.update_model_state is not None:
            new_model_state, state_metrics = arch.update_model_state(
                model_state, jax.lax.stop_gradient(stats)
            )
            model_state = jax.tree.map(lambda a, b: jnp.where(finite, a, b), new_model_state, model_state)
        metrics = {
            **means,
            "tokens": tokens,
            **{name: v for name, v in stats.items() if getattr(v, "ndim", None) == 0},  # scalars only
            "grad_norm": grad_norm,
            "lr": schedule(state.step),
            **state_metrics,
            "finite": finite,
        }
        return TrainState(state.step + 1, params, opt_state, state.rng, model_state), metrics

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
    update_sharding: Any = None,
    sample: Hashable | None = None,
) -> Callable[[TrainState, dict], tuple[TrainState, dict]]:
    """jit the step with the state donated; with a mesh, in/out shardings place state and batch on it, and
    `update_sharding` where the update is computed (`make_train_step`)."""
    step = make_train_step(arch, optimizer, schedule, grad_accum, sample, update_sharding)
    if mesh is None:
        return jax.jit(step, donate_argnums=0)
    return jax.jit(
        step,
        donate_argnums=0,
        in_shardings=(state_sharding, batch_sharding),
        out_shardings=(state_sharding, None),
    )
