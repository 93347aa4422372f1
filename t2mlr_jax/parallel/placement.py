"""Where the model's parameters live on a mesh, read off the parameter table's logical axes."""

from __future__ import annotations

import jax
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from t2mlr_jax.parallel.rules import LOGICAL_AXIS_RULES, ZERO_STAGES, is_axes, tree_shardings


def param_shardings(axes, params_shapes, mesh: Mesh, zero: int = 3):
    """Shardings of a params tree from its table's logical axes (`spec_axes(arch.specs)`), split over the
    data-parallel axes of ZeRO stage `zero` (ZERO_STAGES: ZeRO-3 over fsdp, ZeRO-1 none). Every parameter
    must have axes: one without (or a table entry without a parameter) is an error naming it, never a
    silently replicated model."""
    named = lambda tree, leaf: {
        jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree, is_leaf=leaf)[0]
    }
    have, want = named(params_shapes, None), named(axes, is_axes)
    if have != want:
        raise ValueError(
            f"the parameter table does not match the params: no spec for {sorted(have - want)}, "
            f"no parameter for {sorted(want - have)}"
        )
    return tree_shardings(axes, params_shapes, mesh, ZERO_STAGES[zero].weights)


def update_shardings(axes, params_shapes, mesh: Mesh, zero: int = 3):
    """Where each parameter's optimizer state lives and its update is computed (a params-shaped tree): split
    over the data-parallel axes of ZeRO stage `zero` (ZeRO-3: fsdp, as the weights; ZeRO-1: data and fsdp,
    while the weights stay whole)."""
    return tree_shardings(axes, params_shapes, mesh, ZERO_STAGES[zero].optimizer_state)


def train_state_shardings(
    state_shapes, optimizer: optax.GradientTransformation, params_shardings, moment_shardings, mesh: Mesh
):
    """Shardings of a train state (step, params, opt_state, rng, model_state): the params take
    `params_shardings`, the optimizer's moments their params' `moment_shardings` (`update_shardings`);
    everything else is replicated (the non-gradient model state is small: per-expert biases, counters)."""
    replicated = NamedSharding(mesh, PartitionSpec())
    # Optimizers built from per-group parts (Muon's multi_transform) hold MaskedNode placeholders where
    # another group's parameters would be: they stay placeholders.
    masked = lambda x: isinstance(x, optax.transforms.MaskedNode)
    opt_shardings = optax.tree_map_params(
        optimizer,
        lambda leaf, s: leaf if masked(leaf) else s,
        state_shapes.opt_state,
        moment_shardings,
        transform_non_params=lambda _: replicated,
        is_leaf=masked,
    )
    return state_shapes._replace(
        step=replicated,
        params=params_shardings,
        opt_state=opt_shardings,
        rng=replicated,
        model_state=jax.tree.map(lambda _: replicated, state_shapes.model_state),
    )


def place(host: dict, shardings: dict) -> dict:
    """Host arrays (the same on every process) put in their shardings (the matching entries of `shardings`):
    each device receives only its own shard, so no device ever holds a full copy."""
    return jax.tree.map(
        lambda w, sharding: jax.make_array_from_callback(w.shape, sharding, lambda index: w[index]),
        host,
        {name: shardings[name] for name in host},
    )


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """[B, T] batch arrays: rows over the data-parallel axes (the `batch` rule: data, fsdp, expert)."""
    return NamedSharding(mesh, PartitionSpec(LOGICAL_AXIS_RULES["batch"]))
