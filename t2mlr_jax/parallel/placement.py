"""Where the model's parameters live on a mesh, read off the parameter table's logical axes."""

from __future__ import annotations

import jax
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.params import init_params, param_axes
from t2mlr_jax.parallel.rules import tree_shardings


def param_shardings(cfg: ModelConfig, mesh: Mesh):
    shapes = jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))
    return tree_shardings(param_axes(cfg), shapes, mesh)


def init_params_sharded(cfg: ModelConfig, key: jax.Array, mesh: Mesh) -> dict:
    """Initialise directly into the sharded layout: no host ever holds a full copy of the parameters."""
    return jax.jit(init_params, static_argnums=0, out_shardings=param_shardings(cfg, mesh))(cfg, key)


def _is_axes(x) -> bool:
    return isinstance(x, tuple) and all(a is None or isinstance(a, str) for a in x)


def model_param_shardings(model: ModelConfig | None, params_shapes, mesh: Mesh):
    """Shardings for an architecture's params: the parameter table's axes when the params are that
    table's (T²MLR, transformer, looped), replicated otherwise (e.g. the LSTM baseline)."""
    if model is not None:
        axes = param_axes(model)
        if jax.tree.structure(axes, is_leaf=_is_axes) == jax.tree.structure(params_shapes):
            return tree_shardings(axes, params_shapes, mesh)
    replicated = NamedSharding(mesh, PartitionSpec())
    return jax.tree.map(lambda _: replicated, params_shapes)


def train_state_shardings(
    state_shapes, optimizer: optax.GradientTransformation, params_shardings, mesh: Mesh
):
    """Shardings of a train state (step, params, opt_state, rng): optimizer moments follow their params
    (so fsdp shards Adam's state too), everything else is replicated."""
    replicated = NamedSharding(mesh, PartitionSpec())
    opt_shardings = optax.tree_map_params(
        optimizer,
        lambda _, s: s,
        state_shapes.opt_state,
        params_shardings,
        transform_non_params=lambda _: replicated,
    )
    return state_shapes._replace(
        step=replicated, params=params_shardings, opt_state=opt_shardings, rng=replicated
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
    """[B, T] batch arrays: rows over the data-parallel axes."""
    return NamedSharding(mesh, PartitionSpec(("data", "fsdp")))
