"""One transformer block and what it reads: `apply_block` runs the pre-norm block the config assembles
(QK-norm before or after RoPE, per-layer sliding windows and RoPE bases, attention and output softcaps,
nanochat's resid / x0 scalars and gated value embeddings, Gemma's sandwich norms, the MLP from
`layers.MLPS`), writing its keys and values into a cache when decoding; `Feedback` is the hook through
which variants (LRT memory, thought tokens) feed state into every block, and `cache_keys` / `kv_head_gate`
are the block's pieces those variants reuse. It holds no loop over layers: t2mlr_jax.model.backbone's
`run_blocks` scans or unrolls this block over a range of layers, with the embedding, the head and the
KV cache around it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from t2mlr_jax.model import moe  # noqa: F401  (registers mlp="moe")
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.layers import MLPS, DocumentMask, attend, product, rms_norm, rope
from t2mlr_jax.parallel.rules import RESIDUAL_AXES, constrain

Q_AXES = ("batch", "length", "act_heads", "head_dim")  # [B, T, H, E]
KV_AXES = ("batch", "length", "act_kv_heads", "head_dim")  # [B, T, K, E]


class Feedback(NamedTuple):
    """A per-block hook: state fed into the residual stream before each block and into its keys/values.

    params: a pytree whose leaves are stacked on a leading layer axis [L, ...]; `run_blocks` slices
      [start:end] and scans it with the block params, so each fn sees its own layer's slice (or None).
    inputs: a per-call pytree shared by every block (e.g. a memory m [B, T, D] for this call's tokens).
    residual_fn(p, inputs, h) -> h: the stream entering the block (cast back to h's dtype).
    scalars_fn(p, inputs, (alpha, beta)) -> (alpha, beta): the resid / x0 scalars each slot uses in this
      block (broadcast against [B, T, D]), where some slots have their own (the LRT's thought slots).
    kv_fn(p, inputs, x, k, v) -> (k, v): x [B, T, D] is the block's normed input, k, v [B, T, K, E]
      straight from k_proj / v_proj, before QK-norm and RoPE; the result is what the cache stores.
    capture_fn(p, inputs, x, k, v) -> a pytree of the block's values the caller wants back (k, v as kv_fn
      returns them), stacked on the layer axis in `BlocksOut.captured`.
    Either fn may be None. Build it inside the jitted function (it holds callables).
    """

    params: Any = None
    inputs: Any = None
    residual_fn: Callable | None = None
    kv_fn: Callable | None = None
    capture_fn: Callable | None = None
    scalars_fn: Callable | None = None


class Step(NamedTuple):
    """What every block of one `run_blocks` call shares."""

    positions: Int[Array, "B T"]
    mask: Any  # a DocumentMask (a call over its own slots), else [B, T, S] who attends to whom
    distance: Any  # [B, T, S] query - key (a [B, T, S] mask with sliding windows only), else None
    feedback: Feedback | None
    x0: Any  # [B, T, D] the embedded stream (resid_scalars only), else None


class Layer(NamedTuple):
    """One layer's slices of everything scanned beside the block params (None where unused)."""

    window: Any  # attention window (sliding windows only)
    feedback: Any  # the feedback params' slice
    value_embed: Any  # [B, T, K, E] this layer's value embedding of the tokens (zeros on layers without)
    mlp_state: Any  # the MLP's non-gradient state (e.g. MoE routing biases)
    resid: Any  # (λ_resid, λ_x0) (resid_scalars only)
    rope_theta: Any  # this layer's RoPE base (rope_local_theta only), else None: cfg.rope_theta


def _qk(cfg: ModelConfig, x, weight, positions, theta):
    """RoPE on queries or keys [B, T, N, E], with QK-RMSNorm before (Qwen3) or after (nanochat) it."""
    theta = cfg.rope_theta if theta is None else theta
    if cfg.qk_norm == "before_rope":
        x = rms_norm(x, weight, cfg.norm_eps, cfg.norm_offset)
    x = rope(x, positions, theta, cfg.rope_table_dtype)
    if cfg.qk_norm == "after_rope":
        x = rms_norm(x, weight, cfg.norm_eps, cfg.norm_offset)
    return x


def cache_keys(
    cfg: ModelConfig, params: dict, k: Float[Array, "L B T K E"], positions: Int[Array, "B T"]
) -> Float[Array, "L B T K E"]:
    """Every layer's keys as its cache holds them (QK-norm and RoPE as the block applies them) from its
    keys before those (as a Feedback's kv_fn returns them); stacked layer params."""
    norms = params["layers"]["self_attn"].get("k_norm")
    thetas = cfg.layer_rope_thetas
    return jnp.stack(
        [
            _qk(
                cfg,
                k[i],
                None if norms is None else norms[i].astype(cfg.dtype),
                positions,
                None if thetas is None else thetas[i],
            )
            for i in range(cfg.num_layers)
        ]
    )


def kv_head_gate(
    x: Float[Array, "B T D"], weight: Float[Array, "C N"], scale: float = 2.0
) -> Float[Array, "B T N"]:
    """nanochat's per-kv-head gate `scale` sigmoid(W x[..., :C]), in (0, scale): the LRT release's scale 2
    (1 at a zero-initialised W), karpathy/nanochat's value embeddings' 3."""
    c = weight.shape[0]
    return scale * jax.nn.sigmoid(
        jnp.einsum("btc,cn->btn", x[..., :c], weight, preferred_element_type=jnp.float32)
    )


def _project(x: Float[Array, "B T D"], w: Float[Array, "D N E"]) -> Float[Array, "B T N E"]:
    """x @ w over heads as one [D, N E] matmul: the reshape of a row-major weight is free, where a
    three-axis contraction lets XLA:CPU copy the weight into another layout at every call."""
    b, t, _ = x.shape
    return product("btd,df->btf", x, w.reshape(w.shape[0], -1)).reshape(b, t, *w.shape[1:])


def apply_block(cfg: ModelConfig, p: dict, h, step: Step, layer: Layer, kv):
    """One pre-norm block; returns h, the cache's keys/values after this step, the MLP's stats and what
    the feedback's capture_fn captured (None without one).

    `kv` is (every layer's cached k slots, v slots, this layer's row, write index or slots) with a cache,
    else None (and None comes back).
    """
    fb = step.feedback
    if layer.resid is not None:
        alpha, beta = layer.resid
        if fb is not None and fb.scalars_fn is not None:
            alpha, beta = fb.scalars_fn(layer.feedback, fb.inputs, layer.resid)
        h = (alpha * h + beta * step.x0).astype(h.dtype)
    if fb is not None and fb.residual_fn is not None:
        h = fb.residual_fn(layer.feedback, fb.inputs, h).astype(h.dtype)
    norm = lambda x, name: rms_norm(x, p.get(name), cfg.norm_eps, cfg.norm_offset)
    x = norm(h, "input_layernorm")
    a = p["self_attn"]
    q = _project(x, a["q_proj"])
    q = constrain(_qk(cfg, q, a.get("q_norm"), step.positions, layer.rope_theta), Q_AXES)
    k, v = _project(x, a["k_proj"]), _project(x, a["v_proj"])
    if fb is not None and fb.kv_fn is not None:
        k_fb, v_fb = fb.kv_fn(layer.feedback, fb.inputs, x, k, v)
        k, v = k_fb.astype(k.dtype), v_fb.astype(v.dtype)
    captured = (
        None if fb is None or fb.capture_fn is None else fb.capture_fn(layer.feedback, fb.inputs, x, k, v)
    )
    if layer.value_embed is not None:
        gate = kv_head_gate(x, a["ve_gate"], cfg.ve_gate_scale)[..., None]
        v = v + (gate * layer.value_embed).astype(v.dtype)
    # each tensor-parallel device computes its own kv heads (Megatron), as it does its query heads
    k = constrain(_qk(cfg, k, a.get("k_norm"), step.positions, layer.rope_theta), KV_AXES)
    v = constrain(v, KV_AXES)
    keys, values = k, v
    if kv is not None:  # write this step's slots first, then read the layer: the update stays in place
        k_all, v_all, row, where = kv
        if where.ndim:  # scattered slots [T] (shared by the batch)
            k_all, v_all = (
                c.at[row : row + 1, :, where].set(new[None]) for c, new in ((k_all, k), (v_all, v))
            )
        else:
            at = (row, 0, where, 0, 0)
            k_all, v_all = (
                jax.lax.dynamic_update_slice(c, new[None], at) for c, new in ((k_all, k), (v_all, v))
            )
        keys, values, kv = k_all[row], v_all[row], (k_all, v_all)
    mask = step.mask
    if layer.window is not None:
        if isinstance(mask, DocumentMask):
            mask = dataclasses.replace(mask, window=layer.window)
        else:
            mask = mask & (step.distance <= layer.window)
    attn = attend(q, keys, values, mask, cfg.attn_softcap, cfg.query_pre_attn_scalar, cfg.attention_impl)
    o = a["o_proj"]
    y = product("btf,fd->btd", attn.reshape(*attn.shape[:2], -1), o.reshape(-1, o.shape[-1]))
    if cfg.sandwich_norms:  # HF Gemma: norm the attention output, then the MLP's own pre- and post-norm
        h = h + norm(y, "post_attention_layernorm")
        y, stats = MLPS[cfg.mlp].apply(cfg, p["mlp"], norm(h, "pre_feedforward_layernorm"), layer.mlp_state)
        y = norm(y, "post_feedforward_layernorm")
    else:
        h = h + y
        y, stats = MLPS[cfg.mlp].apply(cfg, p["mlp"], norm(h, "post_attention_layernorm"), layer.mlp_state)
    return constrain(h + y.astype(h.dtype), RESIDUAL_AXES), kv, stats, captured
