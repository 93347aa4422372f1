"""`constant_weight`: (1 - α) x + α r with one learnable α (init `constant_alpha`), clipped to [0, 1]."""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Float

from t2mlr_jax.architectures.t2mlr.mixers.common import pre_norm
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.spec import ParamSpec


def specs(cfg: ModelConfig) -> dict:
    alpha = cfg.recurrence.constant_alpha
    return {"recurrent_alpha": ParamSpec((1,), (None,), lambda k, s, t: jnp.full(s, alpha, t), "scalar")}


def mix(
    cfg: ModelConfig, p: dict, x: Float[Array, "B T D"], r: Float[Array, "B T D"]
) -> tuple[Float[Array, "B T D"], dict]:
    xn, rn = pre_norm(cfg, p, x, r)
    alpha = jnp.clip(p["recurrent_alpha"], 0.0, 1.0).astype(x.dtype)
    return (1 - alpha) * xn + alpha * rn, {"recurrent_gate": alpha[0]}
