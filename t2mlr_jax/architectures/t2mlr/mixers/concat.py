"""`concat`: W_c [x ; r], W_c initialised to [I | 0] (exactly x at init without pre-norm)."""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Float

from t2mlr_jax.architectures.t2mlr.mixers.common import pre_norm
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.spec import ParamSpec


def _identity_on_x(key, shape, dtype):
    d = shape[1]
    return jnp.concatenate([jnp.eye(d, dtype=dtype), jnp.zeros((d, d), dtype)], axis=0)


def specs(cfg: ModelConfig) -> dict:
    d = cfg.hidden_size
    return {"concat_projection": ParamSpec((2 * d, d), ("mixer_in", "embed"), _identity_on_x, "matrix", 1)}


def mix(
    cfg: ModelConfig, p: dict, x: Float[Array, "B T D"], r: Float[Array, "B T D"]
) -> tuple[Float[Array, "B T D"], dict]:
    xn, rn = pre_norm(cfg, p, x, r)
    both = jnp.concatenate([xn, rn], -1)
    return jnp.einsum("...i,io->...o", both, p["concat_projection"].astype(x.dtype)), {}
