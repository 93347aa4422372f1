"""`config.init_from`: start an architecture from a pretrained checkpoint instead of random weights.

T²MLR retrofits a plain transformer (fresh fusion parameters, γ = 0: exactly the pretrained model at
step 0) or continues a T²MLR checkpoint of the same recurrence; the other backbone architectures take its
weights as they are. Start weights belong to the run, not the model: `start_weights` checks the
checkpoint's config when the run is built (before anything compiles, so a checkpoint of another model is
one clear error), and its weights are read only when a fresh run starts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from t2mlr_jax.architectures import Architecture
from t2mlr_jax.architectures.contract import RANDOM_INIT, pretrained_path
from t2mlr_jax.architectures.ponderlm2 import check_release_start
from t2mlr_jax.architectures.t2mlr import check_retrofittable
from t2mlr_jax.config.sections import Experiment
from t2mlr_jax.interop.pretrained import load_pretrained, mismatches, pretrained_config
from t2mlr_jax.model import layer_layout


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


def start_weights(config: Experiment, arch: Architecture) -> Callable[[], dict] | None:
    """The weights a fresh run of `arch` starts from: None when config.init_from names no checkpoint, else
    a loader of the checkpoint's host weights (in `arch`'s layer form), replacing init's top-level entries
    of the same name. The checkpoint is checked now, before anything compiles; its weights are read only
    when the loader is called, so a resumed or evaluated run never reads them."""
    require_init_from(config)
    path = pretrained_path(config)
    if config.init_from_required and config.init_from == RANDOM_INIT:
        logging.warning(
            "init_from=%s: %s starts from random weights, not from the pretrained model %s finetunes",
            RANDOM_INIT,
            arch.name,
            config.name,
        )
    if not path:
        return None
    if arch.backbone is None:
        raise ValueError(
            f"init_from: the {arch.name} architecture has no transformer backbone to load weights into"
        )
    if not Path(path).exists():
        raise FileNotFoundError(f"init_from {path!r} does not exist")
    check_release_start(config, path)
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
    per_layer = layer_layout.is_per_layer(arch.specs)  # model.scan_layers=False; checkpoints are stacked

    def weights() -> dict:
        _, loaded = load_pretrained(path, param_dtype=model.param_dtype)
        loaded = jax.tree.map(lambda w: np.asarray(w, jnp.dtype(model.param_dtype)), loaded)
        return layer_layout.per_layer(loaded) if per_layer else loaded

    return weights
