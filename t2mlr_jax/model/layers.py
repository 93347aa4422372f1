"""Llama building blocks as pure functions: RMSNorm, RoPE (HF rotate-half layout), GQA attention, SwiGLU.

Dimension letters (shared with the einsum strings and the sharding rules):
B batch, T query time, S key time, D model, H query heads, K kv heads, G = H/K heads per kv head,
E head dim, F mlp hidden, V vocab, L layers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

NEG_INF = -1e30  # finite so a fully masked row (padding) averages instead of producing NaN


def rms_norm(x: Float[Array, "*B D"], weight: Float[Array, " D"] | None, eps: float) -> Float[Array, "*B D"]:
    """RMSNorm computed in fp32, cast back to the input dtype (HF Llama semantics)."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    if weight is not None:
        y = y * weight.astype(jnp.float32)
    return y.astype(x.dtype)


def rope(
    x: Float[Array, "B T N E"], positions: Int[Array, "B T"], theta: float | None
) -> Float[Array, "B T N E"]:
    """Rotary embedding in HF's rotate-half layout: pairs are (i, i + E/2). theta=None is NoPE."""
    if theta is None:
        return x
    half = x.shape[-1] // 2
    inv_freq = 1.0 / (theta ** (jnp.arange(half, dtype=jnp.float32) / half))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # B T E/2
    cos = jnp.cos(angles)[:, :, None, :]
    sin = jnp.sin(angles)[:, :, None, :]
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


def attention_mask(
    q_segments: Int[Array, "B T"],
    k_segments: Int[Array, "B S"],
    q_slots: Int[Array, "B T"],
    k_slots: Int[Array, "B S"],
) -> Bool[Array, "B T S"]:
    """Causal within a document: same non-zero segment id and key slot <= query slot."""
    same_doc = (q_segments[:, :, None] == k_segments[:, None, :]) & (k_segments[:, None, :] != 0)
    return same_doc & (k_slots[:, None, :] <= q_slots[:, :, None])


def attend(
    q: Float[Array, "B T H E"],
    k: Float[Array, "B S K E"],
    v: Float[Array, "B S K E"],
    mask: Bool[Array, "B T S"],
) -> Float[Array, "B T H E"]:
    """Grouped-query softmax attention; logits and softmax in fp32."""
    b, t, h, e = q.shape
    kv_heads = k.shape[2]
    q = q.reshape(b, t, kv_heads, h // kv_heads, e)
    logits = jnp.einsum("btkge,bske->bkgts", q, k, preferred_element_type=jnp.float32) * (e**-0.5)
    logits = jnp.where(mask[:, None, None], logits, NEG_INF)
    probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgts,bske->btkge", probs, v)
    return out.reshape(b, t, h, e)


def swiglu(
    x: Float[Array, "B T D"],
    gate_proj: Float[Array, "D F"],
    up_proj: Float[Array, "D F"],
    down_proj: Float[Array, "F D"],
) -> Float[Array, "B T D"]:
    gate = jnp.einsum("btd,df->btf", x, gate_proj)
    up = jnp.einsum("btd,df->btf", x, up_proj)
    return jnp.einsum("btf,fd->btd", jax.nn.silu(gate) * up, down_proj)
