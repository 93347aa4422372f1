"""`config.init_from`: start an architecture from a pretrained checkpoint instead of random weights.

T²MLR retrofits a plain transformer (fresh fusion parameters, γ = 0: exactly the pretrained model at
step 0) or continues a T²MLR checkpoint of the same recurrence; the other backbone architectures take its
weights as they are. The checkpoint's config is checked when the run is built (before anything compiles,
so a checkpoint of another model is one clear error); its weights are read only when a fresh run starts.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from t2mlr_jax.architectures import Architecture, build_architecture
from t2mlr_jax.architectures.contract import RANDOM_INIT, pretrained_path
from t2mlr_jax.config.sections import Experiment
from t2mlr_jax.interop.pretrained import check_retrofittable, load_pretrained, mismatches, pretrained_config


def with_pretrained(arch: Architecture, path: str) -> Architecture:
    """`arch` with the checkpoint at `path` as its starting weights."""
    if arch.backbone is None:
        raise ValueError(
            f"init_from: the {arch.name} architecture has no transformer backbone to load weights into"
        )
    if not Path(path).exists():
        raise FileNotFoundError(f"init_from {path!r} does not exist")
    model = arch.backbone
    checkpoint = pretrained_config(path, param_dtype=model.param_dtype)
    differences = mismatches(checkpoint, model)
    if differences:
        raise ValueError(
            f"init_from {path}: the checkpoint is not config.model ({len(differences)} differing "
            f"fields: {'; '.join(differences)})"
        )
    if model.recurrence is not None and checkpoint.recurrence is None:
        check_retrofittable(model.recurrence)  # the fresh mixer (gammas 0) keeps the pretrained function

    def weights() -> dict:
        _, loaded = load_pretrained(path, param_dtype=model.param_dtype)
        return jax.tree.map(lambda w: np.asarray(w, jnp.dtype(model.param_dtype)), loaded)

    return dataclasses.replace(arch, pretrained=weights)


def require_init_from(config: Experiment) -> None:
    """A config that starts from a pretrained model (init_from_required) refuses to start without one,
    unset or empty alike; init_from="random" trains it from random weights on purpose."""
    if config.init_from_required and not config.init_from:
        raise ValueError(
            f"init_from is required by this config ({config.name} finetunes a pretrained model): pass "
            "--config.init_from=<checkpoint> (a .gguf file, an HF or T²MLR folder, or a training workdir), "
            f"or use its :cpu preset (the shipped SmolLM2-135M-Instruct GGUF), or --config.init_from="
            f"{RANDOM_INIT} to train it from random weights"
        )


def architecture(config: Experiment, name: str | None = None) -> Architecture:
    """The architecture `name` (default config.arch), initialised from config.init_from when that names a
    checkpoint."""
    require_init_from(config)
    arch = build_architecture(config, name)
    if config.init_from_required and config.init_from == RANDOM_INIT:
        logging.warning(
            "init_from=%s: %s starts from random weights, not from the pretrained model %s finetunes",
            RANDOM_INIT,
            arch.name,
            config.name,
        )
    path = pretrained_path(config)
    return with_pretrained(arch, path) if path else arch
