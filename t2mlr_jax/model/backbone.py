"""The backbone as three pure functions over the params pytree: `embed`, `run_blocks`, `head`.

`run_blocks(cfg, params, h, start, end, ...)` runs blocks [start, end) under one `lax.scan` over the
stacked layer parameters, so any contiguous range compiles once per range length. Every model variant
(plain transformer, T²MLR's three modes, later baselines) is a composition of these three.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.layers import attend, attention_mask, rms_norm, rope, swiglu
from t2mlr_jax.parallel.rules import RESIDUAL_AXES, constrain


class KVCache(NamedTuple):
    """Keys/values of every layer for S slots; `index` is the next slot to write (shared by the batch).

    `segment_ids` marks which slots hold which document (0 = empty or padding), so left-padded rows and
    packed documents mask themselves exactly as in a parallel forward.
    """

    k: Float[Array, "L B S K E"]
    v: Float[Array, "L B S K E"]
    segment_ids: Int[Array, "B S"]
    index: Int[Array, ""]


def init_cache(cfg: ModelConfig, batch: int, max_len: int) -> KVCache:
    shape = (cfg.num_layers, batch, max_len, cfg.num_kv_heads, cfg.head_dim)
    dtype = jnp.dtype(cfg.dtype)
    return KVCache(
        jnp.zeros(shape, dtype),
        jnp.zeros(shape, dtype),
        jnp.zeros((batch, max_len), jnp.int32),
        jnp.zeros((), jnp.int32),
    )


def advance(cache: KVCache, num_tokens: int) -> KVCache:
    """Move the write slot past the tokens a step has just stored (once per step, not per block range)."""
    return cache._replace(index=cache.index + num_tokens)


def default_layout(tokens: Int[Array, "B T"]) -> tuple[Int[Array, "B T"], Int[Array, "B T"]]:
    """Positions 0..T-1 and one document per row."""
    b, t = tokens.shape
    return jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t)), jnp.ones((b, t), jnp.int32)


def _cast(tree, dtype: str):
    return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def embed(cfg: ModelConfig, params: dict, tokens: Int[Array, "B T"]) -> Float[Array, "B T D"]:
    return constrain(jnp.take(params["embed_tokens"], tokens, axis=0).astype(cfg.dtype), RESIDUAL_AXES)


def head(cfg: ModelConfig, params: dict, h: Float[Array, "B T D"]) -> Float[Array, "B T V"]:
    """Final norm and the (tied or untied) LM head; logits in fp32."""
    x = rms_norm(h, params["norm"].astype(cfg.dtype), cfg.norm_eps)
    if cfg.tie_embeddings:
        return jnp.einsum(
            "btd,vd->btv", x, params["embed_tokens"].astype(cfg.dtype), preferred_element_type=jnp.float32
        )
    return jnp.einsum(
        "btd,dv->btv", x, params["lm_head"].astype(cfg.dtype), preferred_element_type=jnp.float32
    )


def _block(cfg: ModelConfig, p: dict, h, positions, mask, kv):
    """One pre-norm Llama block; returns h and this step's keys/values.

    `kv` is (this layer's cached k slots, v slots, write index) when decoding with a cache, else None.
    """
    x = rms_norm(h, p["input_layernorm"], cfg.norm_eps)
    a = p["self_attn"]
    q = constrain(
        rope(jnp.einsum("btd,dhe->bthe", x, a["q_proj"]), positions, cfg.rope_theta),
        ("batch", "length", "act_heads", "head_dim"),
    )
    k = rope(jnp.einsum("btd,dke->btke", x, a["k_proj"]), positions, cfg.rope_theta)
    v = jnp.einsum("btd,dke->btke", x, a["v_proj"])
    keys, values = k, v
    if kv is not None:
        k_slots, v_slots, index = kv
        keys = jax.lax.dynamic_update_slice_in_dim(k_slots, k, index, axis=1)
        values = jax.lax.dynamic_update_slice_in_dim(v_slots, v, index, axis=1)
    h = h + jnp.einsum("bthe,hed->btd", attend(q, keys, values, mask), a["o_proj"])
    m = p["mlp"]
    h = h + swiglu(
        rms_norm(h, p["post_attention_layernorm"], cfg.norm_eps), m["gate_proj"], m["up_proj"], m["down_proj"]
    )
    return constrain(h, RESIDUAL_AXES), (k, v)


def _remat(cfg: ModelConfig, fn):
    if cfg.remat == "full":
        return jax.checkpoint(fn)
    if cfg.remat == "dots":
        return jax.checkpoint(fn, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
    return fn


def run_blocks(
    cfg: ModelConfig,
    params: dict,
    h: Float[Array, "B T D"],
    start: int,
    end: int,
    *,
    positions: Int[Array, "B T"],
    segment_ids: Int[Array, "B T"],
    cache: KVCache | None = None,
) -> tuple[Float[Array, "B T D"], KVCache | None]:
    """Run blocks [start, end) on h. With a cache, this step's keys/values go to slots cache.index + [0, T).

    The cache's `index` is not advanced here (a token step may call several ranges); see `advance`.
    """
    if end <= start:
        return h, cache
    layers = _cast(jax.tree.map(lambda p: p[start:end], params["layers"]), cfg.dtype)
    b, t = positions.shape
    if cache is None:
        slots = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        mask = attention_mask(segment_ids, segment_ids, slots, slots)
        body = lambda h, p: (_block(cfg, p, h, positions, mask, None)[0], None)
        h, _ = jax.lax.scan(_remat(cfg, body), h, layers)
        return h, None

    key_segments = jax.lax.dynamic_update_slice_in_dim(cache.segment_ids, segment_ids, cache.index, axis=1)
    q_slots = cache.index + jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    k_slots = jnp.broadcast_to(jnp.arange(key_segments.shape[1], dtype=jnp.int32), key_segments.shape)
    mask = attention_mask(segment_ids, key_segments, q_slots, k_slots)
    cache = cache._replace(segment_ids=key_segments)

    def cached_body(carry, xs):
        # The whole cache rides in the carry and only this step's slots are written, in place (no
        # per-range cache copies); the loop is unrolled, so splitting a token's blocks into the three
        # T²MLR ranges adds no loop overhead to decoding.
        h, k_all, v_all = carry
        p, layer = xs
        h, (k, v) = _block(cfg, p, h, positions, mask, (k_all[layer], v_all[layer], cache.index))
        at = (layer, 0, cache.index, 0, 0)
        return (
            h,
            jax.lax.dynamic_update_slice(k_all, k[None], at),
            jax.lax.dynamic_update_slice(v_all, v[None], at),
        ), None

    (h, k_all, v_all), _ = jax.lax.scan(
        cached_body, (h, cache.k, cache.v), (layers, jnp.arange(start, end)), unroll=True
    )
    return h, cache._replace(k=k_all, v=v_all)


def forward(
    cfg: ModelConfig,
    params: dict,
    tokens: Int[Array, "B T"],
    *,
    positions: Int[Array, "B T"] | None = None,
    segment_ids: Int[Array, "B T"] | None = None,
) -> Float[Array, "B T V"]:
    """The plain transformer: every block once, no recurrence (the reference T²MLR must equal at γ=0)."""
    if positions is None or segment_ids is None:
        positions, segment_ids = default_layout(tokens)
    h, _ = run_blocks(
        cfg,
        params,
        embed(cfg, params, tokens),
        0,
        cfg.num_layers,
        positions=positions,
        segment_ids=segment_ids,
    )
    return head(cfg, params, h)
