"""Where the model's parameters live on a mesh, read off the parameter table's logical axes."""

from __future__ import annotations

import jax
from jax.sharding import Mesh

from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.params import init_params, param_axes
from t2mlr_jax.parallel.rules import tree_shardings


def param_shardings(cfg: ModelConfig, mesh: Mesh):
    shapes = jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))
    return tree_shardings(param_axes(cfg), shapes, mesh)


def init_params_sharded(cfg: ModelConfig, key: jax.Array, mesh: Mesh) -> dict:
    """Initialise directly into the sharded layout: no host ever holds a full copy of the parameters."""
    return jax.jit(init_params, static_argnums=0, out_shardings=param_shardings(cfg, mesh))(cfg, key)
