"""Recirculation (Mozer et al.): a pretrained model's deep state fed back to a shallower layer at inference,
nothing trained. With `rc` a `Recirculation` (source block s, destination block d, the mix):

  two-stack (the paper)  token t runs a first pass through blocks 0..s; its output at s, mixed into its
                         output at d, seeds a second pass of token t through blocks d+1..L-1, whose
                         output predicts token t+1. Keys/values kept for later tokens: the first pass's
                         in blocks 0..d, the second pass's in blocks d+1..L-1 (the first pass's keys there
                         serve only the token itself). So token t+1's first pass through blocks d+1..s
                         attends to the second passes of the tokens before it: the serial dependency
                         that makes exact scoring token by token (`two_stack_serial`).
  parallel two-stack     the same fixed point reached by Jacobi iteration over all tokens at once
                         (`two_stack_parallel`): guess every token's source state, run both passes of
                         every token side by side under one mask, repeat until the guesses stop moving.
  single-stack           token t-1's source state mixed into token t's destination: T²MLR's recurrence
                         with the parameter-free `recirculation` mixer (`single_stack_model`).
  looped (a control)     blocks d+1..s run a second time right after s, no recurrence across tokens.

With alpha = 0 every variant is the unmodified model bit for bit.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from t2mlr_jax.architectures.recirculation.mix import Recirculation
from t2mlr_jax.architectures.t2mlr import exact_forward, jacobi_forward, recurrent
from t2mlr_jax.model.backbone import KVCache, advance, embed, head, init_cache
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.control_flow import PROMPT, RECURRENT
from t2mlr_jax.model.layers import attention_mask
from t2mlr_jax.model.token_layout import Layout, Output, layout_blocks, make_layout, scan_over_tokens

ADAPTIVE = "adaptive_mix"  # the params entry of the adaptive MLP (Recirculation.adaptive)


def two_stack_step(
    cfg: ModelConfig,
    params: dict,
    rc: Recirculation,
    tokens: Int[Array, "B T"],
    cache: KVCache,
    layout: Layout,
) -> tuple[Float[Array, "B T V"], KVCache]:
    """Both passes of the next T tokens with the KV cache (T = 1 for exact serial semantics). The second
    pass overwrites the first pass's keys/values in blocks d+1..s."""
    h, cache = layout_blocks(
        cfg, params, embed(cfg, params, tokens, cache), 0, rc.destination + 1, layout, tokens, cache
    )
    z_src, cache = layout_blocks(cfg, params, h, rc.destination + 1, rc.source + 1, layout, tokens, cache)
    h = rc(h, z_src, layout.positions, params.get(ADAPTIVE))
    h, cache = layout_blocks(cfg, params, h, rc.destination + 1, cfg.num_layers, layout, tokens, cache)
    return head(cfg, params, h), advance(cache, tokens.shape[1])


def two_stack_serial(
    cfg: ModelConfig,
    params: dict,
    rc: Recirculation,
    tokens: Int[Array, "B T"],
    *,
    layout: Layout | None = None,
    cache: KVCache | None = None,
) -> tuple[Float[Array, "B T V"], KVCache]:
    """The paper's semantics exactly: `two_stack_step` one token at a time (`lax.scan`), batched over rows."""
    layout = layout or make_layout(tokens)
    cache = init_cache(cfg, tokens.shape[0], tokens.shape[1]) if cache is None else cache

    def step(cache, token, token_layout):
        logits, cache = two_stack_step(cfg, params, rc, token, cache, token_layout)
        return cache, logits[:, 0]

    cache, logits = scan_over_tokens(step, cache, tokens, layout)
    return logits, cache


class ParallelOutput(NamedTuple):
    logits: Float[Array, "B T V"]
    passes: Int[Array, ""]  # Jacobi passes run (the first, unrecirculated one included)
    change: Float[Array, ""]  # the last pass's largest relative change of a source state
    cache: KVCache | None


def _side_by_side_mask(segment_ids: Int[Array, "B T"]) -> Bool[Array, "B 2*T 2*T"]:
    """Attention among [first passes; second passes] of T tokens in blocks d+1..s: a first pass sees its own
    keys and the second passes of the tokens before it; a second pass sees the second passes up to itself."""
    b, t = segment_ids.shape
    slots = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    causal = attention_mask(segment_ids, segment_ids, slots, slots)
    itself = causal & jnp.eye(t, dtype=bool)
    first = jnp.concatenate([itself, causal & ~itself], axis=2)
    second = jnp.concatenate([jnp.zeros_like(causal), causal], axis=2)
    return jnp.concatenate([first, second], axis=1)


def two_stack_parallel(
    cfg: ModelConfig,
    params: dict,
    rc: Recirculation,
    tokens: Int[Array, "B T"],
    *,
    layout: Layout | None = None,
    tol: float = 1e-4,
    max_passes: int = 16,
    cache: KVCache | None = None,
) -> ParallelOutput:
    """The two-stack by Jacobi iteration on the source states z_src: pass 1 is the unmodified model's
    first pass; each further pass runs every token's first pass (blocks d+1..s, beside the second passes
    seeded by the current z_src) and stops when no z_src moves by more than `tol` relative to its norm, or
    after `max_passes`. After k passes tokens 0..k-1 are exact, so max_passes >= T is `two_stack_serial`.
    With a cache (prefill), it is left as the serial pass leaves it."""
    layout = layout or make_layout(tokens)
    t = tokens.shape[1]
    lower, cache = layout_blocks(
        cfg, params, embed(cfg, params, tokens, cache), 0, rc.destination + 1, layout, tokens, cache
    )
    both = Layout(*(jnp.concatenate([a, a], axis=1) for a in layout))
    both_tokens = jnp.concatenate([tokens, tokens], axis=1)
    mask = _side_by_side_mask(layout.segment_ids)

    # The passes that find z_src carry no gradient (a while_loop cannot be reverse-differentiated); the
    # final mix and second pass do (the adaptive MLP trains through them).
    fixed_params, fixed_lower = jax.lax.stop_gradient((params, lower))

    def refine(z_src):
        seeded = rc(fixed_lower, z_src, layout.positions, fixed_params.get(ADAPTIVE))
        h = jnp.concatenate([fixed_lower, seeded], axis=1)
        out, _ = layout_blocks(
            cfg, fixed_params, h, rc.destination + 1, rc.source + 1, both, both_tokens, mask=mask
        )
        return out[:, :t]

    def relative_change(new, old):
        diff = jnp.linalg.norm((new - old).astype(jnp.float32), axis=-1)
        return jnp.max(diff / jnp.maximum(jnp.linalg.norm(old.astype(jnp.float32), axis=-1), 1e-12))

    def body(state):
        passes, z_src, _ = state
        new = refine(z_src)
        return passes + 1, new, relative_change(new, z_src)

    first, _ = layout_blocks(
        cfg, fixed_params, fixed_lower, rc.destination + 1, rc.source + 1, layout, tokens
    )
    state = (jnp.int32(1), first, jnp.float32(jnp.inf))
    passes, z_src, change = jax.lax.while_loop(lambda s: (s[0] < max_passes) & (s[2] > tol), body, state)
    h = rc(lower, z_src, layout.positions, params.get(ADAPTIVE))
    h, cache = layout_blocks(cfg, params, h, rc.destination + 1, cfg.num_layers, layout, tokens, cache)
    if cache is not None:
        cache = advance(cache, t)
    return ParallelOutput(head(cfg, params, h), passes, change, cache)


def single_stack_model(cfg: ModelConfig, rc: Recirculation) -> ModelConfig:
    """The single-stack variant as a T²MLR model: R = the output of block s, fused into the stream
    entering block d+1 by the parameter-free `recirculation` mixer; run it with T²MLR's exact forward,
    Jacobi forward or decoder, and `single_stack_layout`."""
    return recurrent(
        cfg,
        l_start=rc.destination + 1,
        l_end=rc.source,
        mixer="recirculation",
        mixer_options=rc,
        recurrent_projection=False,
        temporal_residual=False,
        pre_norm=False,
        post_norm=False,
    )


def single_stack_layout(layout: Layout) -> Layout:
    """Every token recurrent except each document's first (it has no previous token)."""
    start = (layout.positions == 0) | (layout.segment_ids == 0)
    control = jnp.where(layout.segment_ids == 0, 0, jnp.where(start, PROMPT, RECURRENT))
    return layout._replace(control_flow=control.astype(jnp.int32))


def looped_logits(
    cfg: ModelConfig,
    params: dict,
    rc: Recirculation,
    tokens: Int[Array, "B T"],
    *,
    layout: Layout | None = None,
) -> Float[Array, "B T V"]:
    """The training-free looping control: blocks d+1..s run again right after block s (the paper's
    "duplicate layers l1+1..l2 after l2" with l1 = d, l2 = s); no state crosses tokens."""
    layout = layout or make_layout(tokens)
    h = embed(cfg, params, tokens)
    for start, end in (
        (0, rc.source + 1),
        (rc.destination + 1, rc.source + 1),
        (rc.source + 1, cfg.num_layers),
    ):
        h, _ = layout_blocks(cfg, params, h, start, end, layout, tokens)
    return head(cfg, params, h)


STACKS = ("two", "single")
EVALUATIONS = ("serial", "parallel")


def recirculated_logits(
    cfg: ModelConfig,
    params: dict,
    rc: Recirculation,
    tokens: Int[Array, "B T"],
    layout: Layout,
    *,
    stack: str = "two",
    evaluation: str = "serial",
    tol: float = 1e-4,
    max_passes: int = 16,
) -> tuple[Float[Array, "B T V"], Int[Array, ""], Float[Array, ""]]:
    """Scoring with recirculation: the two-stack or the single-stack, serial (exact) or parallel (Jacobi;
    the single-stack runs max_passes passes). Returns the logits, the passes run (0 when serial) and the
    last pass's change (the two-stack parallel's, for its convergence; 0 when serial, NaN: not measured)."""
    exact, unmeasured = jnp.float32(0.0), jnp.float32(jnp.nan)
    if stack == "single":
        model, params, layout = (
            single_stack_model(cfg, rc),
            {**params, "mixer": {}},
            single_stack_layout(layout),
        )
        if evaluation == "serial":
            return exact_forward(model, params, tokens, layout=layout).logits, jnp.int32(0), exact
        out = jacobi_forward(model, params, tokens, layout=layout, d_forward=max_passes, d_backward=0)
        return out.logits, jnp.int32(max_passes), unmeasured
    if evaluation == "serial":
        return two_stack_serial(cfg, params, rc, tokens, layout=layout)[0], jnp.int32(0), exact
    out = two_stack_parallel(cfg, params, rc, tokens, layout=layout, tol=tol, max_passes=max_passes)
    return out.logits, out.passes, out.change


@dataclasses.dataclass(frozen=True)
class TwoStackDecoder:
    """Generation with the two-stack (a `t2mlr_jax.model.generate.Decoder`): prefill serial, or by
    `prefill_passes` parallel passes; then `two_stack_step` per token. No state beyond the KV cache."""

    model: ModelConfig
    rc: Recirculation
    prefill_mode: str = "serial"
    prefill_passes: int = 16
    prefill_tol: float = 1e-4

    def init_cache(self, batch: int, num_tokens: int) -> KVCache:
        return init_cache(self.model, batch, num_tokens)

    def prefill(self, params, tokens, layout, cache) -> Output:
        if self.prefill_mode == "serial":
            logits, cache = two_stack_serial(self.model, params, self.rc, tokens, layout=layout, cache=cache)
        else:
            out = two_stack_parallel(
                self.model,
                params,
                self.rc,
                tokens,
                layout=layout,
                tol=self.prefill_tol,
                max_passes=self.prefill_passes,
                cache=cache,
            )
            logits, cache = out.logits, out.cache
        return Output(logits, self._no_state(tokens), {}, cache)

    def step(self, params, tokens, state, cache, layout) -> Output:
        logits, cache = two_stack_step(self.model, params, self.rc, tokens, cache, layout)
        return Output(logits, state, {}, cache)

    def _no_state(self, tokens):
        return jnp.zeros((tokens.shape[0], 1), self.model.dtype)
