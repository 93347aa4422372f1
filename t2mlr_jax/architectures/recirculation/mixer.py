"""`recirculation`: T²MLR's path with no parameters, the previous token's source state folded into this
token's destination stream by `t2mlr_jax.architectures.recirculation.mix` (the single-stack recirculation).
Settings: `RecurrenceConfig.mixer_options`, a `Recirculation` (None: the paper's default mix, alpha 0.1
with the magnitude ratio). A zero R (no previous token: a document start) leaves the stream untouched,
whatever the scheme."""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from t2mlr_jax.architectures.recirculation.mix import Recirculation
from t2mlr_jax.architectures.t2mlr import MIXERS, Mixer
from t2mlr_jax.model.config import ModelConfig

DEFAULT_MIX = Recirculation(source=1, destination=0)  # the mixer reads only alpha, scheme and ramp


def specs(cfg: ModelConfig) -> dict:
    return {}


def mix(
    cfg: ModelConfig,
    p: dict,
    x: Float[Array, "B T D"],
    r: Float[Array, "B T D"],
    *,
    positions: Int[Array, "B T"] | None,
) -> tuple[Float[Array, "B T D"], dict]:
    mixed = (cfg.recurrence.mixer_options or DEFAULT_MIX)(x, r, positions)
    has_source = jnp.any(r != 0, axis=-1, keepdims=True)
    return jnp.where(has_source, mixed, x), {}


MIXERS.register("recirculation", Mixer(specs=specs, mix=mix, keys={}, positional=True, options=True))
