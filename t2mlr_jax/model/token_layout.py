"""The token layout every backbone system shares: where each token stands (`Layout`: positions, documents,
control flow), the defaults filled in (`make_layout`), the blocks run over a layout (`layout_blocks`), the
previous token's state (`shift_right`) and an exact recurrence's scan over time (`scan_over_tokens`); and
`Output`, what a recurrent forward returns (T²MLR's, the LRT's, the looped baselines')."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from t2mlr_jax.model.backbone import KVCache, default_layout, run_blocks
from t2mlr_jax.model.control_flow import RECURRENT


class Layout(NamedTuple):
    positions: Int[Array, "B T"]
    segment_ids: Int[Array, "B T"]
    control_flow: Int[Array, "B T"]


class Output(NamedTuple):
    logits: Float[Array, "B T V"]
    recurrent_state: Float[Array, "B D"]  # R for the token after the last one (decoding continues from it)
    gate_stats: dict  # per-token gate activations of the fusion that produced the logits, [B, T] each
    cache: KVCache | None
    # Jacobi passes that produced R (the unfused one, the refinements run, i.e. the D of the fixed-depth
    # forward with the same result); None from the other modes. Dynamic under recurrence.jacobi_tolerance.
    jacobi_passes: Int[Array, ""] | None = None
    # Under recurrence.jacobi_tolerance: the last detached pass's `relative_change` of R (at or above the
    # tolerance: stopped by its cap, unconverged); None otherwise.
    jacobi_change: Float[Array, ""] | None = None


def make_layout(tokens: Int[Array, "B T"], positions=None, segment_ids=None, control_flow=None) -> Layout:
    """Fill in defaults: positions 0..T-1, one document per row, every real token recurrent."""
    default_pos, default_seg = default_layout(tokens)
    positions = default_pos if positions is None else positions
    segment_ids = default_seg if segment_ids is None else segment_ids
    if control_flow is None:
        control_flow = jnp.where(segment_ids != 0, RECURRENT, 0)
    return Layout(*(jnp.asarray(a, jnp.int32) for a in (positions, segment_ids, control_flow)))


def shift_right(m: Float[Array, "B T D"], positions: Int[Array, "B T"]) -> Float[Array, "B T D"]:
    """The cache each token sees: the previous token's, and zeros at position 0 (a document start)."""
    r = jnp.pad(m[:, :-1], ((0, 0), (1, 0), (0, 0)))
    return jnp.where((positions == 0)[..., None], jnp.zeros_like(r), r)


def scan_over_tokens(step, carry, tokens: Int[Array, "B T"], layout: Layout, *inputs: Array):
    """`lax.scan` over time of step(carry, token [B, 1], its layout, *its inputs [B, 1, ...]) -> (carry, ys);
    `inputs` are per-token arrays [B, T, ...]; ys come back [B, T, ...]. The exact recurrences (T²MLR's,
    the LRT's) are this over their decode step."""

    def body(carry, xs):
        token, *rest = (a[:, None] for a in xs)
        return step(carry, token, Layout(*rest[: len(layout)]), *rest[len(layout) :])

    xs = jax.tree.map(lambda a: jnp.swapaxes(a, 0, 1), (tokens, *layout, *inputs))
    carry, ys = jax.lax.scan(body, carry, xs)
    return carry, jax.tree.map(lambda a: jnp.swapaxes(a, 0, 1), ys)


def layout_blocks(cfg, params, h, start, end, layout, tokens, cache=None, mask=None):
    """`run_blocks` [start, end) over a Layout, returning (h, cache); the tokens feed nanochat's value
    embeddings and x0 (resid scalars); `mask` as run_blocks'."""
    out = run_blocks(
        cfg,
        params,
        h,
        start,
        end,
        positions=layout.positions,
        segment_ids=layout.segment_ids,
        cache=cache,
        tokens=tokens,
        mask=mask,
    )
    return out.h, out.cache
