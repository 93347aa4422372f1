"""Autoregressive generation: prefill (exact, or k Jacobi passes as in the paper's Table 8), then one
token per step with the KV cache and the one-vector-per-row recurrent state. The loop (`generate_with`)
takes any `Decoder`: T²MLR's (t2mlr_jax.architectures.t2mlr), the LRT's, ...

Batches are left padded (`prompt_mask` 0 on padding): each row gets positions starting at 0 on its
first real token, so its R resets there and padding never reaches it — every row decodes as if alone.
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from t2mlr_jax.model.backbone import KVCache, unstack_layers
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.control_flow import RECURRENT
from t2mlr_jax.model.token_layout import Layout, Output


class GenerateOutput(NamedTuple):
    tokens: Int[Array, "B N"]  # generated tokens; pad_id after a row's EOS
    lengths: Int[Array, " B"]  # generated tokens per row, EOS included


class Sampling(NamedTuple):
    """How each generated token is chosen (`sample`): greedy at temperature 0, else drawn after temperature,
    top-k and top-p filtering. Hashable: a static argument of the compiled loop."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0


GREEDY = Sampling()


def sample(
    logits: Float[Array, "B V"],
    key: jax.Array | None,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
) -> Int[Array, " B"]:
    """Greedy when temperature == 0; otherwise temperature, then top-k, then nucleus (top-p) filtering."""
    if temperature == 0.0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logits = logits.astype(jnp.float32) / temperature
    if top_k:
        kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    if top_p < 1.0:
        order = jnp.argsort(-logits, axis=-1)
        sorted_logits = jnp.take_along_axis(logits, order, axis=-1)
        probs = jax.nn.softmax(sorted_logits, axis=-1)
        # Keep the smallest prefix whose mass reaches top_p (always at least the best token).
        drop_sorted = (jnp.cumsum(probs, axis=-1) - probs) >= top_p
        drop = jnp.zeros_like(drop_sorted).at[jnp.arange(logits.shape[0])[:, None], order].set(drop_sorted)
        logits = jnp.where(drop, -jnp.inf, logits)
    return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


def check_sampling(max_new_tokens: int, temperature: float, top_k: int, top_p: float) -> None:
    """Reject bad sampling settings before anything is traced."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0, got {top_k}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


@runtime_checkable
class Decoder(Protocol):
    """How a model decodes with a KV cache and one state vector per row; hashable (a frozen dataclass),
    since it is a static argument of the compiled loop. T²MLR's state is R, the LRT's its memory m.

    init_cache(batch, num_tokens) -> KVCache   # room for num_tokens tokens (K + 1 slots each with K
                                               # thought slots; a layer per executed block when looped)
    prefill(params, tokens, layout, cache) -> Output   # the prompt, filling the cache
    step(params, tokens, state, cache, layout) -> Output   # one token [B, 1]
    """

    model: ModelConfig

    def init_cache(self, batch: int, num_tokens: int) -> KVCache: ...

    def prefill(self, params, tokens, layout: Layout, cache: KVCache) -> Output: ...

    def step(self, params, tokens, state, cache: KVCache, layout: Layout) -> Output: ...


def generate_with(
    decoder: Decoder,
    params: Any,  # what the decoder reads (T²MLR: the params; the LRT: (params, model_state))
    prompt_tokens: Int[Array, "B P"],
    prompt_mask: Int[Array, "B P"],
    *,
    max_new_tokens: int,
    key: jax.Array | None = None,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    eos_id: int | None = None,
    pad_id: int = 0,
    prompt_control_flow: Int[Array, "B P"] | None = None,
) -> GenerateOutput:
    """Generate up to `max_new_tokens` per row with `decoder`; rows stop independently at `eos_id`.

    `prompt_control_flow` marks prompt tokens as recurrent (2, the default: pretraining) or not
    (1, SFT prompts as in the release); generated tokens are always recurrent.
    """
    check_sampling(max_new_tokens, temperature, top_k, top_p)
    if temperature > 0 and key is None:
        raise ValueError("sampling with temperature > 0 needs a PRNG key")
    if prompt_control_flow is None:
        prompt_control_flow = jnp.where(prompt_mask != 0, RECURRENT, 0)
    return _generate(
        decoder,
        params,
        prompt_tokens,
        jnp.asarray(prompt_mask, jnp.int32),
        prompt_control_flow,
        key if key is not None else jax.random.PRNGKey(0),
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        eos_id=eos_id,
        pad_id=pad_id,
    )


@partial(
    jax.jit,
    static_argnums=0,
    static_argnames=("max_new_tokens", "temperature", "top_k", "top_p", "eos_id", "pad_id"),
)
def _generate(
    decoder,
    params,
    prompt_tokens,
    prompt_mask,
    prompt_control_flow,
    key,
    *,
    max_new_tokens,
    temperature,
    top_k,
    top_p,
    eos_id,
    pad_id,
):
    b, p = prompt_tokens.shape
    params = unstack_layers(decoder.model, params)  # once, not at every token; a no-op when done already
    positions = jnp.maximum(jnp.cumsum(prompt_mask, axis=1) - 1, 0)
    layout = Layout(positions, prompt_mask, prompt_control_flow * prompt_mask)
    out = decoder.prefill(
        params,
        prompt_tokens,
        layout,
        decoder.init_cache(b, p + max_new_tokens),
    )
    key, sub = jax.random.split(key)
    first = sample(out.logits[:, -1], sub, temperature, top_k, top_p)
    tokens = jnp.full((b, max_new_tokens), pad_id, jnp.int32).at[:, 0].set(first)
    done = jnp.zeros((b,), bool) if eos_id is None else first == eos_id
    next_pos = positions[:, -1] + 1

    def cond(state):
        i, _, _, _, done, _ = state
        return (i < max_new_tokens) & ~jnp.all(done)

    def body(state):
        i, tokens, r, cache, done, key = state
        step_layout = Layout(
            (next_pos + i - 1)[:, None], jnp.ones((b, 1), jnp.int32), jnp.full((b, 1), RECURRENT, jnp.int32)
        )
        step = decoder.step(
            params, jax.lax.dynamic_slice_in_dim(tokens, i - 1, 1, axis=1), r, cache, step_layout
        )
        key, sub = jax.random.split(key)
        nxt = jnp.where(done, pad_id, sample(step.logits[:, -1], sub, temperature, top_k, top_p))
        tokens = jax.lax.dynamic_update_slice_in_dim(tokens, nxt[:, None], i, axis=1)
        if eos_id is not None:
            done = done | (nxt == eos_id)
        return i + 1, tokens, step.recurrent_state, step.cache, done, key

    state = (jnp.int32(1), tokens, out.recurrent_state, out.cache, done, key)
    _, tokens, _, _, _, _ = jax.lax.while_loop(cond, body, state)
    return with_lengths(tokens, eos_id)


@partial(jax.jit, static_argnums=(0, 3))
def teacher_forced(
    decoder: Decoder, params: Any, tokens: Int[Array, "B T"], prompt_len: int
) -> Float[Array, "B T V"]:
    """The logits a decoder gives `tokens` when they are fed to it as generation feeds its own choices:
    the first `prompt_len` as the prompt (prefill), then one per cached step. Equal to the model's
    sequential (exact) forward up to fp32 round-off: what decode tests compare, logits to logits."""
    b, t = tokens.shape
    params = unstack_layers(decoder.model, params)
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    ones = jnp.ones((b, t), jnp.int32)
    recurrent = jnp.full((b, t), RECURRENT, jnp.int32)
    layout = lambda a, z: Layout(positions[:, a:z], ones[:, a:z], recurrent[:, a:z])
    out = decoder.prefill(params, tokens[:, :prompt_len], layout(0, prompt_len), decoder.init_cache(b, t))

    def step(carry, i):  # a scan, not an unrolled loop: one step compiled, whatever the length
        state, cache = carry
        token = jax.lax.dynamic_slice_in_dim(tokens, i, 1, axis=1)
        step_layout = Layout(jnp.full((b, 1), i, jnp.int32), ones[:, :1], recurrent[:, :1])
        out = decoder.step(params, token, state, cache, step_layout)
        return (out.recurrent_state, out.cache), out.logits[:, 0]

    _, stepped = jax.lax.scan(step, (out.recurrent_state, out.cache), jnp.arange(prompt_len, t))
    return jnp.concatenate([out.logits, jnp.swapaxes(stepped, 0, 1)], axis=1)


def with_lengths(tokens: Int[Array, "B N"], eos_id: int | None) -> GenerateOutput:
    """Generated tokens with each row's length: up to and including its first EOS, else all N."""
    n = tokens.shape[1]
    if eos_id is None:
        return GenerateOutput(tokens, jnp.full((tokens.shape[0],), n, jnp.int32))
    is_eos = tokens == eos_id
    return GenerateOutput(
        tokens, jnp.where(is_eos.any(axis=1), jnp.argmax(is_eos, axis=1) + 1, n).astype(jnp.int32)
    )
