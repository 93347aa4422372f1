"""Our arch "ponderlm2" (or a baseline of the PonderLM-2 release: "looped", "pause") on an imported Llama
backbone with a release's settings (its section, release.ponderlm2_settings): the architecture, a
batch of one document per row, and its evaluation logits, which verify.py compares with the release's."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from t2mlr_jax.architectures import Architecture, build_architecture
from t2mlr_jax.config.sections import Experiment
from t2mlr_jax.model.config import ModelConfig


def ponderlm2(cfg: ModelConfig, settings: dict, seq_len: int, arch: str = "ponderlm2") -> Architecture:
    """Our arch "ponderlm2" (or `arch`, e.g. "looped") on this backbone with `settings` (its section), for
    rows of `seq_len` slots."""
    config = Experiment(name="ponderlm2_release", model=cfg, arch=arch).replace(
        data={"task": "s5_retrieval", "seq_len": seq_len},
        eval={"window": seq_len},
        baseline={"param_match": False},  # the release's width, not widened to a T²MLR model's count
        **{arch: settings},
    )
    return build_architecture(config)


def batch_of(tokens: jax.Array, length: int) -> dict:
    """One document per row, `length` wide (a training row at K holds length / (K + 1) tokens; the rest
    is padding), next-token targets supervised up to the last token, as transformers' shifted loss."""
    t = tokens.shape[1]
    padded = jnp.pad(tokens, ((0, 0), (0, length - t)))
    ones = jnp.ones_like(padded)
    return {
        "tokens": padded,
        "targets": jnp.pad(tokens[:, 1:], ((0, 0), (0, length - t + 1))),
        "loss_mask": (jnp.arange(length) < t - 1).astype(jnp.int32)[None] * ones,
        "positions": jnp.cumsum(ones, 1) - 1,
        "segment_ids": ones,
        "control_flow": 2 * ones,
    }


def evaluation_logits(cfg: ModelConfig, params: dict, settings: dict, tokens) -> np.ndarray:
    """Arch ponderlm2's evaluation logits (section `settings`) of one document per row of `tokens`."""
    tokens = jnp.asarray(tokens)
    t = tokens.shape[1]
    arch = ponderlm2(cfg, settings, t * (max(settings["thoughts"]) + 1))
    batch, state = batch_of(tokens, t), arch.init_model_state()
    return np.asarray(
        jax.jit(lambda p: arch.apply(p, batch, training=False, rng=None, model_state=state).logits)(params)
    )
