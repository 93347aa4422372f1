"""`none`: x, the plain transformer (the recurrence computed and discarded); no parameters."""

from __future__ import annotations

from jaxtyping import Array, Float

from t2mlr_jax.model.config import ModelConfig


def specs(cfg: ModelConfig) -> dict:
    return {}


def mix(
    cfg: ModelConfig, p: dict, x: Float[Array, "B T D"], r: Float[Array, "B T D"]
) -> tuple[Float[Array, "B T D"], dict]:
    return x, {}
