"""The backbone as three pure functions over the params pytree: `embed`, `run_blocks`, `head`.

`run_blocks(cfg, params, h, start, end, ...)` runs blocks [start, end) under one `lax.scan` over the
stacked layer parameters, so any contiguous range compiles once per range length (with a KV cache, or on
`unstack_layers`' per-layer form, it unrolls over the layers instead); it returns
`BlocksOut(h, cache, stats)`. Every model variant (plain transformer, T²MLR's three modes, the LRT, the
baselines) is a composition of these three (`head` = `unembed(final_norm(h))`).

The block itself is t2mlr_jax.model.block's `apply_block`, assembled from config-chosen parts (QK-norm
and its order, per-layer sliding windows, attention / output logit softcaps, the MLP from the
`layers.MLPS` registry with its optional non-gradient state and per-layer stats, norms with or without
weights, nanochat's resid / x0 scalars and value embeddings); karpathy/nanochat's smear is in `embed` and
backout in `run_blocks`. Per-layer choices (window sizes, value embeddings, scalars) are scanned arrays,
so the stack still compiles once. Variants that feed state back into the blocks (LRT memory, thought
tokens) pass a `block.Feedback`, one hook point rather than a branch per variant.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from t2mlr_jax.model import layer_layout
from t2mlr_jax.model.block import Feedback, Layer, Step, apply_block
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.layers import PRODUCT, DocumentMask, attention_mask, product, rms_norm, softcap
from t2mlr_jax.parallel.rules import RESIDUAL_AXES, constrain

FULL_WINDOW = np.iinfo(np.int32).max  # a full-attention layer's entry in the scanned window array
LATENT = -1  # the token id of a slot without a vocabulary token (a latent thought): no value embedding


class KVCache(NamedTuple):
    """Keys/values of every layer for S slots; `index` is the next slot to write (shared by the batch).

    `segment_ids` marks which slots hold which document (0 = empty or padding), so left-padded rows and
    packed documents mask themselves exactly as in a parallel forward; `tokens` the token of each slot
    (LATENT where none), which smear reads back for the token after it.
    """

    k: Float[Array, "L B S K E"]
    v: Float[Array, "L B S K E"]
    segment_ids: Int[Array, "B S"]
    index: Int[Array, ""]
    tokens: Int[Array, "B S"]


def init_cache(cfg: ModelConfig, batch: int, max_len: int) -> KVCache:
    shape = (cfg.num_layers, batch, max_len, cfg.num_kv_heads, cfg.head_dim)
    dtype = jnp.dtype(cfg.dtype)
    return KVCache(
        jnp.zeros(shape, dtype),
        jnp.zeros(shape, dtype),
        jnp.zeros((batch, max_len), jnp.int32),
        jnp.zeros((), jnp.int32),
        jnp.full((batch, max_len), LATENT, jnp.int32),
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


def unstack_layers(cfg: ModelConfig, tree: Any) -> Any:
    """`tree` with every params dict's `layers` as a tuple of per-layer trees in the compute dtype. Done
    once before a loop over tokens (generation, the exact recurrence): a loop body that slices (and casts)
    its layers out of the stack copies every weight at every token, twice the memory traffic of reading
    it where it lies. `run_blocks` takes this form anywhere (unrolled over the layers), and `generate`
    takes params already in it, so that decoding many prompts copies the stack never."""
    cast = lambda layers: tuple(_cast(p, cfg.dtype) for p in layer_layout.split(layers))
    return layer_layout.map_layers(tree, cast)


def split_layers(cfg: ModelConfig, params: dict, bounds: Sequence[int]) -> list[dict]:
    """`params` once per range of blocks [0, b_0), [b_0, b_1), ..., [b_n, L), its stacked `layers` cut to
    that range in the compute dtype; `run_blocks` takes each for its own range. One `lax.split` cuts
    them, whose gradient is one concatenate: ranges sliced one by one (and a range a loop reruns, sliced
    at every pass) each pad their gradient to the whole stack, and those pads are summed.
    `unstack_layers`' per-layer form needs no cut: each range gets `params` whole."""
    edges = [0, *bounds, cfg.num_layers]
    if isinstance(params["layers"], tuple):
        return [params] * (len(edges) - 1)
    leaves, tree = jax.tree.flatten(params["layers"])
    cut = [jax.lax.split(leaf, [b - a for a, b in zip(edges, edges[1:])], axis=0) for leaf in leaves]
    return [
        {**params, "layers": _cast(tree.unflatten([pieces[i] for pieces in cut]), cfg.dtype)}
        for i in range(len(edges) - 1)
    ]


def _block_params(cfg: ModelConfig, layers: dict | tuple, start: int, end: int) -> list | dict:
    """Blocks [start, end)'s params: a list of per-layer trees from `unstack_layers`' form, else the
    stacked slice (for `lax.scan`) or, from `split_layers`, the stack as given, each in the compute dtype."""
    if isinstance(layers, tuple):
        return [_cast(p, cfg.dtype) for p in layers[start:end]]
    count = jax.tree.leaves(layers)[0].shape[0]
    if count == cfg.num_layers:
        return _cast(jax.tree.map(lambda p: p[start:end], layers), cfg.dtype)
    if count != end - start:
        raise ValueError(f"run_blocks: {count} stacked layers: not the model's nor blocks [{start}, {end})")
    return _cast(layers, cfg.dtype)


def _norm_weight(params: dict, name: str, dtype: str):
    """A norm's scale in the compute dtype, or None for a weightless norm (norm_weights=False)."""
    return params[name].astype(dtype) if name in params else None


def _token_embedding(cfg: ModelConfig, params: dict, tokens: Int[Array, "B T"]) -> Float[Array, "B T D"]:
    h = jnp.take(params["embed_tokens"], tokens, axis=0).astype(cfg.dtype)
    if cfg.embed_scale:  # HF Gemma: sqrt(hidden_size) cast to the embedding's dtype
        h = h * jnp.asarray(cfg.hidden_size**0.5, h.dtype)
    if cfg.embed_norm:
        h = rms_norm(h, _norm_weight(params, "embed_norm", cfg.dtype), cfg.norm_eps, cfg.norm_offset)
    return h


def embed(
    cfg: ModelConfig, params: dict, tokens: Int[Array, "B T"], cache: KVCache | None = None
) -> Float[Array, "B T D"]:
    """The stream entering block 0. With smear, each token's previous one is the row's token before it,
    or for the first, the cache's last vocabulary token (thought slots skipped) when decoding with a
    `cache` (none at a row's start)."""
    h = _token_embedding(cfg, params, tokens)
    if cfg.smear_channels is not None:
        h = _smear(cfg, params, h, cache)
    return constrain(h, RESIDUAL_AXES)


def _smear(cfg: ModelConfig, params: dict, h: Float[Array, "B T D"], cache: KVCache | None):
    """karpathy/nanochat's smear: h_t + λ σ(W h_t[:C]) h_(t-1), on the token embeddings."""
    if cache is None:
        first = jnp.zeros_like(h[:, :1])
    else:
        slots = jnp.arange(cache.tokens.shape[1])
        written = (slots < cache.index) & (cache.tokens >= 0)
        last = jnp.take_along_axis(
            cache.tokens, jnp.argmax(jnp.where(written, slots, -1), axis=1)[:, None], 1
        )
        last = jnp.where(written.any(axis=1, keepdims=True), last, LATENT)
        first = _token_embedding(cfg, params, jnp.maximum(last, 0)) * (last >= 0)[..., None].astype(h.dtype)
    previous = jnp.concatenate([first, h[:, :-1]], axis=1)
    w = params["smear_gate"].astype(cfg.dtype)
    gate = params["smear_lambda"].astype(cfg.dtype) * jax.nn.sigmoid(
        jnp.einsum("btc,co->bto", h[..., : w.shape[0]], w)
    )
    return h + gate * previous


def final_norm(cfg: ModelConfig, params: dict, h: Float[Array, "B T D"]) -> Float[Array, "B T D"]:
    """The last hidden state the head reads (the LRT's memory)."""
    return rms_norm(h, _norm_weight(params, "norm", cfg.dtype), cfg.norm_eps, cfg.norm_offset)


def unembed(cfg: ModelConfig, params: dict, x: Float[Array, "B T D"]) -> Float[Array, "B T V"]:
    """The (tied or untied) LM head on the final-normed state; logits in fp32, softcapped when configured."""
    if cfg.tie_embeddings:
        logits = product("btd,vd->btv", x, params["embed_tokens"].astype(cfg.dtype), jnp.float32)
    else:
        logits = product("btd,dv->btv", x, params["lm_head"].astype(cfg.dtype), jnp.float32)
    return logits if cfg.logit_softcap is None else softcap(logits, cfg.logit_softcap)


def head(cfg: ModelConfig, params: dict, h: Float[Array, "B T D"]) -> Float[Array, "B T V"]:
    """Final norm and the LM head."""
    return unembed(cfg, params, final_norm(cfg, params, h))


class BlocksOut(NamedTuple):
    h: Float[Array, "B T D"]
    cache: KVCache | None
    stats: dict  # the MLP's per-layer stats stacked on a leading [end - start] axis ({} for most MLPs)
    captured: Any = None  # the feedback's capture_fn's values, stacked the same way (None without one)


def _remat(cfg: ModelConfig, fn):
    if cfg.remat == "full":
        return jax.checkpoint(fn)
    if cfg.remat == "dots":
        policies = jax.checkpoint_policies
        saved = policies.save_from_both_policies(
            policies.dots_with_no_batch_dims_saveable, policies.save_only_these_names(PRODUCT)
        )
        return jax.checkpoint(fn, policy=saved)
    return fn


def _value_embeds(cfg: ModelConfig, params: dict, tokens, start: int, end: int):
    """Each layer's value embedding of the tokens [end - start, B, T, K, E]; zeros on layers without one."""
    layers = cfg.value_embed_layers
    slot = np.asarray([layers.index(i) if i in layers else 0 for i in range(start, end)])
    has = np.asarray([i in layers for i in range(start, end)], np.float32)
    table = params["value_embeds"].astype(cfg.dtype)
    embedded = jnp.take(table, jnp.maximum(tokens, 0), axis=1) * (tokens >= 0)[..., None, None]  # LATENT: 0
    return embedded[slot] * has[:, None, None, None, None].astype(cfg.dtype)


def _windows(cfg: ModelConfig) -> list[int]:
    """Each layer's attention window, FULL_WINDOW where it has none (scanned as an array)."""
    return [FULL_WINDOW if w is None else w for w in cfg.layer_windows]


def _layer_slices(cfg, params, start, end, feedback, tokens, mlp_state) -> Layer:
    """Everything scanned beside the block params, sliced to blocks [start, end)."""
    cut = lambda tree: None if tree is None else jax.tree.map(lambda a: a[start:end], tree)
    windows = None
    if any(w is not None for w in cfg.layer_windows):
        windows = jnp.asarray(_windows(cfg), jnp.int32)
        windows = windows[start:end]
    value_embed = None
    if cfg.value_embeds:
        if tokens is None:
            raise ValueError("run_blocks: value_embeds needs the tokens (tokens=...)")
        value_embed = _value_embeds(cfg, params, tokens, start, end)
    resid = None
    if cfg.resid_scalars:
        resid = cut((params["resid_lambdas"], params["x0_lambdas"]))
        resid = jax.tree.map(lambda a: a.astype(cfg.dtype), resid)
    thetas = None if cfg.layer_rope_thetas is None else jnp.asarray(cfg.layer_rope_thetas, jnp.float32)
    return Layer(
        windows,
        cut(feedback.params if feedback is not None else None),
        value_embed,
        cut(mlp_state),
        resid,
        None if thetas is None else thetas[start:end],
    )


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
    feedback: Feedback | None = None,
    tokens: Int[Array, "B T"] | None = None,
    x0: Float[Array, "B T D"] | None = None,
    mlp_state: Any = None,
    cache_row: int | None = None,
    mask: Bool[Array, "B T T"] | None = None,
    cache_slots: Int[Array, " T"] | None = None,
) -> BlocksOut:
    """Run blocks [start, end) on h. With a cache, this step's keys/values go to slots cache.index + [0, T).

    The cache's `index` is not advanced here (a token step may call several ranges); see `advance`.
    `feedback` (optional) hooks state into every block's residual stream and keys/values; its inputs
    cover this call's T tokens (one token per call when decoding). `tokens` feed the value embeddings
    (none at LATENT slots) and x0 of the resid / x0 scalars: `x0` when given (a thought slot's input
    state), else the tokens' embedding, else h for a range from block 0. `mlp_state` (stacked on
    layers) is the MLP's non-gradient state; the MLP's per-layer stats come back in `stats`.
    `cache_row`: the cache layer block `start` uses (default `start`); a looped model, which runs a
    block more than once per token, keeps one cache layer per executed block.
    `mask` (no cache): who attends to whom among this call's slots, replacing causal-within-a-document
    (recirculation's parallel two-stack runs two passes of every token side by side); sliding windows
    then count positions, not slots.
    `cache_slots` (with a cache): the slots this call's tokens take, shared by the batch, in place of
    cache.index + [0, T) (the LRT's interleaved training rewrites every N-th slot of a full pass's keys).
    With backout, a range ending at the last block subtracts the output of block `cfg.backout_layer`, so
    it must start at or before that block.
    """
    if end <= start:
        return BlocksOut(h, cache, {})
    if cfg.resid_scalars and x0 is None:
        if tokens is None and start != 0:
            raise ValueError(
                f"run_blocks: resid_scalars needs the tokens for a range starting at block {start}"
            )
        x0 = h if tokens is None else embed(cfg, params, tokens, cache)
    x0 = x0 if cfg.resid_scalars else None
    blocks = functools.partial(
        _run_range,
        cfg,
        params,
        positions=positions,
        segment_ids=segment_ids,
        feedback=feedback,
        tokens=tokens,
        x0=x0,
        mlp_state=mlp_state,
        mask=mask,
        cache_slots=cache_slots,
    )
    if not (cfg.backout and end == cfg.num_layers):
        return blocks(h, start, end, cache=cache, cache_row=cache_row)
    cut = cfg.backout_layer + 1
    if start >= cut or cache_row not in (None, start):
        raise ValueError(
            f"run_blocks: backout subtracts block {cfg.backout_layer}'s output: blocks [{start}, {end}) "
            "must start at or before it, each block once (no cache_row)"
        )
    lower = blocks(h, start, cut, cache=cache, cache_row=None)
    upper = blocks(lower.h, cut, end, cache=lower.cache, cache_row=None)
    h = upper.h - params["backout_lambda"].astype(cfg.dtype) * lower.h
    stacked = lambda a, b: jax.tree.map(lambda *x: jnp.concatenate(x), a, b)
    return BlocksOut(
        h, upper.cache, stacked(lower.stats, upper.stats), stacked(lower.captured, upper.captured)
    )


def _run_range(
    cfg,
    params,
    h,
    start,
    end,
    *,
    positions,
    segment_ids,
    cache,
    feedback,
    tokens,
    x0,
    mlp_state,
    cache_row,
    mask,
    cache_slots,
) -> BlocksOut:
    """`run_blocks` on blocks [start, end) once x0 is known, backout aside."""
    layers = _block_params(cfg, params["layers"], start, end)
    per_layer = _layer_slices(cfg, params, start, end, feedback, tokens, mlp_state)
    b, t = positions.shape
    windowed = per_layer.window is not None
    if cache is None:
        if cache_slots is not None:
            raise ValueError("run_blocks: cache_slots are slots of a cache (cache=...)")
        distance = None
        if mask is None:
            mask = DocumentMask(segment_ids, windows=tuple(sorted(set(_windows(cfg)))) if windowed else ())
        elif windowed:  # a custom mask's windows count positions
            distance = positions[:, :, None] - positions[:, None, :]
        step = Step(positions, mask, distance, feedback, x0)
        if not isinstance(layers, list):

            def body(h, xs):
                h, _, stats, captured = apply_block(cfg, xs[0], h, step, xs[1], None)
                return h, (stats, captured)

            h, (stats, captured) = jax.lax.scan(_remat(cfg, body), h, (layers, per_layer))
            return BlocksOut(h, None, stats, captured)
    else:
        if mask is not None:
            raise ValueError("run_blocks: a custom mask is for a call without a cache")
        slot_tokens = jnp.full((b, t), LATENT, jnp.int32) if tokens is None else tokens.astype(jnp.int32)
        if cache_slots is None:
            where = cache.index
            key_segments = jax.lax.dynamic_update_slice_in_dim(
                cache.segment_ids, segment_ids, cache.index, axis=1
            )
            written = jax.lax.dynamic_update_slice_in_dim(cache.tokens, slot_tokens, cache.index, axis=1)
            q_slots = cache.index + jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        else:
            where = jnp.asarray(cache_slots, jnp.int32)
            key_segments = cache.segment_ids.at[:, where].set(segment_ids)
            written = cache.tokens.at[:, where].set(slot_tokens)
            q_slots = jnp.broadcast_to(where, (b, t))
        k_slots = jnp.broadcast_to(jnp.arange(key_segments.shape[1], dtype=jnp.int32), key_segments.shape)
        mask = attention_mask(segment_ids, key_segments, q_slots, k_slots)
        distance = q_slots[:, :, None] - k_slots[:, None, :] if windowed else None
        step = Step(positions, mask, distance, feedback, x0)
        cache = cache._replace(segment_ids=key_segments, tokens=written)
        if not isinstance(layers, list):
            layers = [jax.tree.map(lambda a: a[i], layers) for i in range(end - start)]

    # Unrolled over the layers as given: with a cache, so splitting a token's blocks into the three T²MLR
    # ranges adds no loop overhead to decoding (the whole cache is carried along and only this step's
    # slots are written, in place); with unstacked layers, so each weight is read where it lies.
    first_row = start if cache_row is None else cache_row
    kv = None if cache is None else (cache.k, cache.v)
    # No cache: a forward over per-layer weights, each block rematerialised as the scan's body is.
    block = _remat(cfg, lambda h, p, layer: apply_block(cfg, p, h, step, layer, None))
    outs = []
    for i, p in enumerate(layers):
        layer = jax.tree.map(lambda a: a[i], per_layer)
        if kv is None:
            h, _, *out = block(h, p, layer)
        else:
            h, kv, *out = apply_block(cfg, p, h, step, layer, (*kv, first_row + i, where))
        outs.append(out)
    stats, captured = jax.tree.map(lambda *a: jnp.stack(a), *outs)
    return BlocksOut(h, None if kv is None else cache._replace(k=kv[0], v=kv[1]), stats, captured)


def forward(
    cfg: ModelConfig,
    params: dict,
    tokens: Int[Array, "B T"],
    *,
    positions: Int[Array, "B T"] | None = None,
    segment_ids: Int[Array, "B T"] | None = None,
    feedback: Feedback | None = None,
    mlp_state: Any = None,
) -> Float[Array, "B T V"]:
    """The plain transformer: every block once, no recurrence (the reference T²MLR must equal at γ=0)."""
    if positions is None or segment_ids is None:
        positions, segment_ids = default_layout(tokens)
    out = run_blocks(
        cfg,
        params,
        embed(cfg, params, tokens),
        0,
        cfg.num_layers,
        positions=positions,
        segment_ids=segment_ids,
        feedback=feedback,
        tokens=tokens,
        mlp_state=mlp_state,
    )
    return head(cfg, params, out.h)
