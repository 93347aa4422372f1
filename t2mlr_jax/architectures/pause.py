"""Pause tokens: after every token, `n` learned pause embeddings that share its position id; the
prediction for a token is read at its last pause (Goyal et al., the paper's "pause x2" baseline)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from t2mlr_jax.model.backbone import embed, head, run_blocks
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.recurrence import Layout
from t2mlr_jax.model.spec import normal

PAUSE_PARAM = "pause_embedding"


def init_pause(cfg: ModelConfig, key: jax.Array) -> jax.Array:
    return normal(cfg.init_std)(key, (cfg.hidden_size,), jnp.dtype(cfg.param_dtype))


def pause_forward(
    cfg: ModelConfig, params: dict, tokens: Int[Array, "B T"], layout: Layout, *, num_pause: int
) -> Float[Array, "B T V"]:
    b, t = tokens.shape
    group = 1 + num_pause
    h = embed(cfg, params, tokens)[:, :, None]
    pauses = jnp.broadcast_to(params[PAUSE_PARAM].astype(h.dtype), (b, t, num_pause, h.shape[-1]))
    h = jnp.concatenate([h, pauses], axis=2).reshape(b, t * group, -1)
    expand = lambda a: jnp.repeat(a, group, axis=1)
    h, _ = run_blocks(
        cfg,
        params,
        h,
        0,
        cfg.num_layers,
        positions=expand(layout.positions),
        segment_ids=expand(layout.segment_ids),
    )
    return head(cfg, params, h.reshape(b, t, group, -1)[:, :, -1])
