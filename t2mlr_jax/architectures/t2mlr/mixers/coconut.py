"""`coconut`: P(r), the fused stream replaced by the cache (the Coconut-style baseline); no parameters."""

from __future__ import annotations

from jaxtyping import Array, Float

from t2mlr_jax.architectures.t2mlr.mixers.common import post, pre_norm
from t2mlr_jax.model.config import ModelConfig


def specs(cfg: ModelConfig) -> dict:
    return {}


def mix(
    cfg: ModelConfig, p: dict, x: Float[Array, "B T D"], r: Float[Array, "B T D"]
) -> tuple[Float[Array, "B T D"], dict]:
    return post(cfg, pre_norm(cfg, p, x, r)[1]), {}
