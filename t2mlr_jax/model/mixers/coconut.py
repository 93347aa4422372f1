"""`coconut`: P(r), the fused stream replaced by the cache (the Coconut-style baseline); no parameters."""

from __future__ import annotations

from jaxtyping import Array, Float

from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.mixers.common import post, pre_norm


def specs(cfg: ModelConfig) -> dict:
    return {}


def mix(
    cfg: ModelConfig, p: dict, x: Float[Array, "B T D"], r: Float[Array, "B T D"]
) -> tuple[Float[Array, "B T D"], dict]:
    return post(cfg, pre_norm(cfg, p, x, r)[1]), {}
