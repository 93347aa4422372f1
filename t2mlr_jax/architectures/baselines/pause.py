"""Pause tokens: after every token, `n` learned pause embeddings that share its position id; the
prediction for a token is read at its last pause (Goyal et al., the paper's "pause x2" baseline)."""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from t2mlr_jax.architectures.contract import Architecture, register_architecture
from t2mlr_jax.architectures.recompute import recompute_architecture
from t2mlr_jax.architectures.t2mlr import baseline_backbone
from t2mlr_jax.config.sections import Experiment, at_least
from t2mlr_jax.model import flops
from t2mlr_jax.model.backbone import embed, head, run_blocks
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.params import param_specs
from t2mlr_jax.model.spec import ParamSpec, normal
from t2mlr_jax.model.token_layout import Layout

PAUSE_PARAM = "pause_embedding"


def pause_specs(cfg: ModelConfig) -> dict:
    """The backbone's table plus the one learned pause embedding."""
    embedding = ParamSpec((cfg.hidden_size,), ("embed",), normal(cfg.init_std), "embedding")
    return {**param_specs(cfg), PAUSE_PARAM: embedding}


def pause_forward(
    cfg: ModelConfig,
    params: dict,
    tokens: Int[Array, "B T"],
    layout: Layout,
    *,
    num_pause: int,
    embed_scale: float = 1.0,
) -> Float[Array, "B T V"]:
    b, t = tokens.shape
    group = 1 + num_pause
    h = embed(cfg, params, tokens)[:, :, None]
    pauses = jnp.broadcast_to(params[PAUSE_PARAM].astype(h.dtype), (b, t, num_pause, h.shape[-1]))
    h = jnp.concatenate([h, pauses], axis=2).reshape(b, t * group, -1)
    h = h if embed_scale == 1.0 else (h * embed_scale).astype(h.dtype)
    expand = lambda a: jnp.repeat(a, group, axis=1)
    h = run_blocks(
        cfg,
        params,
        h,
        0,
        cfg.num_layers,
        positions=expand(layout.positions),
        segment_ids=expand(layout.segment_ids),
    ).h
    return head(cfg, params, h.reshape(b, t, group, -1)[:, :, -1])


def _build(config: Experiment) -> Architecture:
    model, num_pause = baseline_backbone(config, pause_specs), config.pause.tokens
    scale = math.sqrt(model.hidden_size) if config.pause.embed_scale else 1.0
    logits_fn = lambda params, tokens, layout: pause_forward(
        model, params, tokens, layout, num_pause=num_pause, embed_scale=scale
    )

    return recompute_architecture(
        "pause", pause_specs(model), model.param_dtype, logits_fn, backbone=model,
        max_seq_len=model.max_seq_len // (1 + num_pause),
        train_flops=lambda seq_len: train_flops(model, seq_len, num_pause),
    )  # fmt: skip


def train_flops(cfg: ModelConfig, seq_len: int, num_pause: int) -> float:
    """Training FLOPs of a row of `seq_len` tokens: one pass over the row lengthened by the pauses
    ((1 + num_pause) seq_len slots, causal), the head at each token's last pause only."""
    return flops.train(flops.pass_flops(cfg, seq_len * (1 + num_pause)) + flops.head_flops(cfg, seq_len))


@dataclasses.dataclass(frozen=True)
class PauseSettings:
    """Pause tokens after each token (config section `pause`)."""

    tokens: int = 2
    embed_scale: bool = False  # every slot's embedding x sqrt(H): PonderLM-2's release's pause baseline

    def __post_init__(self):
        at_least("pause.tokens", self.tokens, 1)


register_architecture("pause", _build, settings=PauseSettings)
