"""T²MLR's forward modes, each a short composition of embed / run_blocks / head with `fuse` and
`update_cache` (t2mlr_jax.architectures.t2mlr.fusion):

  jacobi_forward   temporal-parallel: an unfused pass, then D-1 refinement passes of the middle block
                   [l_start, l_end] (`fori_loop`, fully stop_gradient'ed except the last B), then a
                   final pass. Exactly the release's D/B semantics: the gradient reaches back through
                   the last B refinements only. With recurrence.jacobi_tolerance, the detached passes
                   stop early once R has converged (`lax.while_loop`).
  exact_forward    the middle block token by token (`lax.scan` over time) carrying R and the KV cache, the
                   blocks below and above it over all tokens at once; with `bptt=B` the gradient of each
                   token flows through at most B links of the recurrent chain.
  decode_step      one token with the KV cache and R (the body of generation).

A model with `recurrence=None` runs through the same functions as a plain transformer.
Layouts (t2mlr_jax.model.token_layout, shared by every backbone system): positions (RoPE, and R resets to
zero where position == 0: a document start), segment_ids (0 = padding; attention never crosses documents),
control_flow (0 pad / 1 prompt / 2 recurrent; only recurrent positions are fused and get the temporal
residual).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from t2mlr_jax.architectures.t2mlr.fusion import fuse, update_cache
from t2mlr_jax.model.backbone import (
    KVCache,
    advance,
    embed,
    head,
    init_cache,
    split_layers,
    unstack_layers,
)
from t2mlr_jax.model.config import ModelConfig, check_depths
from t2mlr_jax.model.control_flow import RECURRENT
from t2mlr_jax.model.params import gathered, param_specs
from t2mlr_jax.model.token_layout import (
    Layout,
    Output,
    layout_blocks,
    make_layout,
    scan_over_tokens,
    shift_right,
)


def _middle(cfg, params, h, layout, tokens, cache=None):
    l_start, l_end = cfg.layer_range
    return layout_blocks(cfg, params, h, l_start, l_end + 1, layout, tokens, cache)


def _advance(cache, tokens):
    return None if cache is None else advance(cache, tokens.shape[1])


def _plain_pass(cfg, params, h, layout, cache, tokens, recurrent_state) -> Output:
    """A model without recurrence: every block once; the recurrent state passes through untouched."""
    h, cache = layout_blocks(cfg, params, h, 0, cfg.num_layers, layout, tokens, cache)
    return Output(head(cfg, params, h), recurrent_state, {}, _advance(cache, tokens))


def _fused_middle(cfg, params, x, r, layout, tokens, cache=None, middle=None):
    """Fuse the cache each token sees (r) into the stream entering l_start (x), run the middle block
    (through the KV cache when there is one): (its output, each token's new cache m, the gate stats, the
    KV cache). `middle`: the params `split_layers` cut for blocks l_start..l_end (default: `params`)."""
    mixer = params["mixer"]
    fused, stats = fuse(cfg, mixer, x, r, layout.control_flow, layout.positions)
    out, cache = _middle(cfg, params if middle is None else middle, fused, layout, tokens, cache)
    return out, update_cache(cfg, mixer, out, r, layout.control_flow), stats, cache


def _fused_pass(cfg, params, x, r, layout, cache, tokens, middle=None, upper=None) -> Output:
    """From the stream entering l_start (x) and the cache each token sees (r): fuse, run blocks
    l_start..L-1 (through the KV cache when there is one), and return the logits with the next token's R.
    The last pass of every mode: Jacobi's final pass and each decoding step. `middle` / `upper`: the
    params `split_layers` cut for blocks l_start..l_end and l_end+1..L-1 (default: `params`)."""
    out, m, stats, cache = _fused_middle(cfg, params, x, r, layout, tokens, cache, middle)
    upper = params if upper is None else upper
    h, cache = layout_blocks(cfg, upper, out, cfg.layer_range[1] + 1, cfg.num_layers, layout, tokens, cache)
    return Output(head(cfg, params, h), m[:, -1], stats, _advance(cache, tokens))


def _seen(recurrent_state: Float[Array, "B D"], positions: Int[Array, "B 1"], dtype) -> Float[Array, "B 1 D"]:
    """The previous token's R as the one token of a step sees it: zero at a document start."""
    return jnp.where((positions == 0)[..., None], 0.0, recurrent_state[:, None].astype(dtype))


def relative_change(
    new: Float[Array, "B T D"], old: Float[Array, "B T D"], read: Bool[Array, "B T"]
) -> Float[Array, ""]:
    """max over rows b of ||new_b - old_b|| / max(||old_b||, tiny), each norm over b's positions where
    R is read (`read`) and all channels, in fp32: how far a Jacobi pass still moved R."""
    where = read[..., None]
    norm = lambda a: jnp.sqrt(jnp.sum(jnp.where(where, a, 0.0) ** 2, axis=(1, 2)))
    new, old = new.astype(jnp.float32), old.astype(jnp.float32)
    return jnp.max(norm(new - old) / jnp.maximum(norm(old), jnp.finfo(jnp.float32).tiny))


def _until_converged(
    refine: Callable[[Float[Array, "B T D"]], Float[Array, "B T D"]],
    r: Float[Array, "B T D"],
    read: Bool[Array, "B T"],
    max_passes: int,
    tolerance: float,
) -> tuple[Int[Array, ""], Float[Array, "B T D"], Float[Array, ""]]:
    """Apply `refine` to R until one pass moves it by less than `tolerance` (`relative_change` over the
    positions `read`), at most `max_passes` times: (passes run, R, the last pass's change)."""

    def body(state):
        ran, r, _ = state
        new = refine(r)
        return ran + 1, new, relative_change(new, r, read)

    # `not change < tolerance`: a NaN change never stops early.
    keep_going = lambda s: (s[0] < max_passes) & ~(s[2] < tolerance)
    return jax.lax.while_loop(keep_going, body, (jnp.int32(0), r, jnp.float32(jnp.inf)))


def jacobi_forward(
    cfg: ModelConfig,
    params: dict,
    tokens: Int[Array, "B T"],
    *,
    layout: Layout | None = None,
    d_forward: int | None = None,
    d_backward: int | None = None,
    cache: KVCache | None = None,
) -> Output:
    """Temporal-parallel forward with D = d_forward Jacobi passes, gradient through the last B = d_backward.

    With a cache (Jacobi prefill), the lower blocks' keys/values come from the shared first pass and
    the upper ones from the final pass; `recurrent_state` is the final pass's cache at the last token.
    With recurrence.jacobi_tolerance > 0 the detached passes (the first D-1-B refinements) stop after the
    first one whose `relative_change` of R is below it; `jacobi_passes` says how many passes ran.
    """
    layout = layout or make_layout(tokens)
    rec = cfg.recurrence
    h = embed(cfg, params, tokens, cache)
    if rec is None:
        return _plain_pass(cfg, params, h, layout, cache, tokens, jnp.zeros(h.shape[::2], h.dtype))
    d_forward = rec.d_forward if d_forward is None else d_forward
    d_backward = rec.d_backward if d_backward is None else d_backward
    check_depths(d_forward, d_backward)
    l_start, l_end = cfg.layer_range
    lower, middle, upper = split_layers(cfg, params, (l_start, l_end + 1))  # the middle: once, not per pass
    middle = gathered(cfg, middle, param_specs(cfg), ("layers", "mixer"))  # what every pass rereads
    x, cache = layout_blocks(cfg, lower, h, 0, l_start, layout, tokens, cache)

    def refine(p, x, r):
        """One Jacobi pass: fuse R into the stream, run the middle block, update and shift the cache."""
        _, m, _, _ = _fused_middle(cfg, p, x, r, layout, tokens)
        return shift_right(m, layout.positions)

    h0, _ = _middle(cfg, middle, x, layout, tokens)  # the unfused first pass
    r = shift_right(h0, layout.positions)  # R<1>: neither residual-added nor normalised
    if d_backward < d_forward:
        r = jax.lax.stop_gradient(r)
    n_grad = min(d_backward, d_forward - 1)
    n_detached, passes, change = d_forward - 1 - n_grad, jnp.int32(d_forward), None
    if n_detached:
        # Passes whose output is detached: no tangent may enter (inputs stop_gradient'ed), so autodiff
        # keeps none of their activations alive, and a while_loop (not differentiable) may run them.
        frozen = jax.lax.stop_gradient((middle, x, r))
        detached = lambda r: refine(*frozen[:2], r)
        if rec.jacobi_tolerance:
            read = layout.control_flow >= RECURRENT  # R is fused only there: elsewhere its value is unused
            ran, r, change = _until_converged(detached, frozen[2], read, n_detached, rec.jacobi_tolerance)
            passes = passes - n_detached + ran
        else:
            r = jax.lax.fori_loop(0, n_detached, lambda _, r: detached(r), frozen[2])
    if n_grad:
        r, _ = jax.lax.scan(lambda r, _: (refine(middle, x, r), None), r, None, length=n_grad)
    # The final pass goes through the cache, so prefill leaves keys/values for decoding.
    out = _fused_pass(cfg, params, x, r, layout, cache, tokens, middle, upper)
    return out._replace(jacobi_passes=passes, jacobi_change=change)


def decode_step(
    cfg: ModelConfig,
    params: dict,
    tokens: Int[Array, "B T"],
    recurrent_state: Float[Array, "B D"],
    cache: KVCache,
    layout: Layout,
) -> Output:
    """One token (T = 1) with the KV cache: fuse R_{t-1} at l_start, update R_t after l_end.

    `recurrent_state` is the previous token's cache; it is reset to zero at a document start.
    """
    h = embed(cfg, params, tokens, cache)
    if cfg.recurrence is None:
        return _plain_pass(cfg, params, h, layout, cache, tokens, recurrent_state)
    x, cache = layout_blocks(cfg, params, h, 0, cfg.layer_range[0], layout, tokens, cache)
    return _fused_pass(
        cfg, params, x, _seen(recurrent_state, layout.positions, h.dtype), layout, cache, tokens
    )


def exact_forward(
    cfg: ModelConfig,
    params: dict,
    tokens: Int[Array, "B T"],
    *,
    layout: Layout | None = None,
    bptt: int | None = None,
    cache: KVCache | None = None,
    recurrent_state: Float[Array, "B D"] | None = None,
) -> Output:
    """Exact sequential recurrence: the middle block [l_start, l_end] token by token (`lax.scan` over time)
    carrying R and the KV cache; the blocks below and above it, which R reaches only through the same
    token's stream, over all tokens at once (the token-by-token decode_step's values, to round-off: a
    prompt's prefill reads those weights once, not once per token).

    bptt=None: full backpropagation through time. bptt=B: truncated, each token's loss reaching back
    through at most B links of the R chain. It runs B+1 copies of the sequence side by side; copy j
    is fed copy j-1's cache (copy 0 a stop_gradient'ed one) and the last copy gives the logits. All
    copies carry identical values, so this has exactly the gradient of Jacobi with D >= T and that B.
    """
    layout = layout or make_layout(tokens)
    b, t = tokens.shape
    copies = 1 if bptt is None else int(bptt) + 1
    if bptt is not None:
        check_depths(1, bptt)
        tile = lambda a: jnp.tile(a, (copies,) + (1,) * (a.ndim - 1))
        tokens, layout = tile(tokens), Layout(*map(tile, layout))
    if cache is None:
        cache = init_cache(cfg, b * copies, t)
    if recurrent_state is None:
        recurrent_state = jnp.zeros((b * copies, cfg.hidden_size), cfg.dtype)
    h = embed(cfg, params, tokens, cache)
    if cfg.recurrence is None:
        out = _plain_pass(cfg, params, h, layout, cache, tokens, recurrent_state)
        return out._replace(logits=out.logits[-b:], recurrent_state=out.recurrent_state[-b:])
    l_start, l_end = cfg.layer_range
    params = unstack_layers(cfg, params)  # once, not at every token
    x, cache = layout_blocks(cfg, params, h, 0, l_start, layout, tokens, cache)

    def step(carry, token, token_layout, x):
        r, cache = carry
        if bptt is not None:  # copy j continues copy j-1's chain; copy 0 starts a fresh (detached) one
            r = r.reshape(copies, b, -1)
            r = jnp.concatenate([jax.lax.stop_gradient(r[:1]), r[:-1]]).reshape(copies * b, -1)
        r = _seen(r, token_layout.positions, x.dtype)
        out, m, stats, cache = _fused_middle(cfg, params, x, r, token_layout, token, cache)
        return (m[:, -1], advance(cache, 1)), (out[:, 0], {k: v[:, 0] for k, v in stats.items()})

    start = cache.index
    (r, cache), (out, stats) = scan_over_tokens(step, (recurrent_state, cache), tokens, layout, x)
    h, cache = layout_blocks(
        cfg, params, out, l_end + 1, cfg.num_layers, layout, tokens, cache._replace(index=start)
    )
    logits, stats = jax.tree.map(lambda a: a[-b:], (head(cfg, params, h), stats))
    return Output(logits, r[-b:], stats, advance(cache, t))


def forward(
    cfg: ModelConfig,
    params: dict,
    tokens: Int[Array, "B T"],
    *,
    mode: str = "jacobi",
    layout: Layout | None = None,
    d_forward: int | None = None,
    d_backward: int | None = None,
    bptt: int | None = None,
) -> Output:
    """One explicit entry point: mode 'jacobi' (training default) or 'exact' (evaluation default)."""
    if mode == "jacobi":
        return jacobi_forward(cfg, params, tokens, layout=layout, d_forward=d_forward, d_backward=d_backward)
    if mode == "exact":
        return exact_forward(cfg, params, tokens, layout=layout, bptt=bptt)
    raise ValueError(f"mode must be 'jacobi' or 'exact', got {mode!r}")
