"""One entry point for any supported checkpoint, and turning a pretrained transformer into T²MLR."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp

from t2mlr_jax.interop.checkpoint import is_orbax_checkpoint, load_params
from t2mlr_jax.interop.gguf import load_gguf
from t2mlr_jax.interop.hf import load_hf
from t2mlr_jax.interop.t2mlr_torch import is_t2mlr_folder, load_t2mlr_torch
from t2mlr_jax.model.config import ModelConfig, RecurrenceConfig
from t2mlr_jax.model.fusion import GAMMA_MIXERS, mixer_specs
from t2mlr_jax.model.params import init_from_specs

# Mixers for which Phi(x, R) == x at initialisation (the gammas start at 0), so retrofitting keeps the logits.
IDENTITY_AT_INIT = GAMMA_MIXERS + ("none",)


def load_pretrained(path_or_gguf: Path | str, *, param_dtype: str = "float32",
                    progress: bool = False) -> tuple[ModelConfig, dict]:
    """(ModelConfig, params) from a .gguf file, an HF Llama folder, the authors' T²MLR folder or our orbax
    checkpoint, recognised by their contents. `param_dtype` applies to the PyTorch and GGUF formats."""
    path = Path(path_or_gguf)
    if path.is_file() and path.suffix == ".gguf":
        return load_gguf(path, param_dtype=param_dtype, progress=progress)
    if is_orbax_checkpoint(path):
        return load_params(path)
    if is_t2mlr_folder(path):
        return load_t2mlr_torch(path, param_dtype=param_dtype, progress=progress)
    if (path / "config.json").exists():
        return load_hf(path, param_dtype=param_dtype, progress=progress)
    raise ValueError(f"{path}: not a .gguf file, an orbax checkpoint, or a folder with a config.json")


def retrofit(cfg: ModelConfig, params: dict, recurrence: RecurrenceConfig,
             key: jax.Array) -> tuple[ModelConfig, dict]:
    """A pretrained plain transformer plus fresh fusion parameters with γ = 0: the T²MLR model it gives
    computes exactly the original logits until training moves the gammas."""
    if cfg.recurrence is not None:
        raise ValueError("retrofit: the model already has a recurrence")
    if recurrence.mixer not in IDENTITY_AT_INIT:
        raise ValueError(f"retrofit: mixer {recurrence.mixer!r} is not the identity at initialisation, so it "
                         f"would change the pretrained model; choose one of {IDENTITY_AT_INIT}")
    cfg = cfg.replace(recurrence=recurrence).validate()
    mixer = init_from_specs(mixer_specs(cfg), key, cfg.param_dtype)
    # γ = 0 by construction, not by relying on the initialiser.
    mixer = {name: jnp.zeros_like(value) if name.startswith("rezero_gamma") else value
             for name, value in mixer.items()}
    return cfg, {**params, "mixer": mixer}
