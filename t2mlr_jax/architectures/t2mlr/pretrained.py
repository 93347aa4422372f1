"""Turning a pretrained plain transformer into T²MLR: fresh fusion parameters with γ = 0."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from t2mlr_jax.architectures.t2mlr.fusion import mixer_specs
from t2mlr_jax.architectures.t2mlr.mixers import MIXERS
from t2mlr_jax.architectures.t2mlr.settings import RecurrenceConfig
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.spec import init_from_specs

# Mixers for which Phi(x, R) == x at initialisation (the gammas start at 0), so retrofitting keeps the logits.
IDENTITY_AT_INIT = tuple(name for name, mixer in MIXERS.items() if mixer.rezero) + ("none",)


def retrofit(
    cfg: ModelConfig, params: dict, recurrence: RecurrenceConfig, key: jax.Array
) -> tuple[ModelConfig, dict]:
    """A pretrained plain transformer plus fresh fusion parameters with γ = 0: the T²MLR model it gives
    computes exactly the original logits until training moves the gammas."""
    if cfg.recurrence is not None:
        raise ValueError("retrofit: the model already has a recurrence")
    check_retrofittable(recurrence)
    cfg = cfg.replace(recurrence=recurrence)
    mixer = init_from_specs(mixer_specs(cfg), key, cfg.param_dtype)
    # γ = 0 by construction, not by relying on the initialiser.
    mixer = {
        name: jnp.zeros_like(value) if name.startswith("rezero_gamma") else value
        for name, value in mixer.items()
    }
    return cfg, {**params, "mixer": mixer}


def check_retrofittable(recurrence: RecurrenceConfig) -> None:
    if recurrence.mixer not in IDENTITY_AT_INIT:
        raise ValueError(
            f"retrofit: mixer {recurrence.mixer!r} is not the identity at initialisation, so it "
            f"would change the pretrained model; choose one of {IDENTITY_AT_INIT}"
        )
    if recurrence.gamma_recurrent_init:
        raise ValueError(
            f"retrofit: recurrence.gamma_recurrent_init={recurrence.gamma_recurrent_init} would change the "
            "pretrained model at init (retrofitting starts every gamma at 0); leave it at 0"
        )
