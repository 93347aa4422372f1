"""Greedy decoding for architectures that have only a causal full-sequence forward (looped, pause, LSTM).

The prompt (left padded) and the tokens generated so far sit in one fixed [B, P + N] buffer; each step
re-runs the forward on it and reads the logits of the last filled slot. Causality makes the unfilled
tail irrelevant, so this is exactly greedy decoding, at O(N) forwards instead of a KV cache.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from t2mlr_jax.architectures.contract import Architecture, Outputs, layout_of
from t2mlr_jax.model.control_flow import RECURRENT
from t2mlr_jax.model.generate import GREEDY, GenerateOutput, with_lengths
from t2mlr_jax.model.token_layout import Layout

LogitsFn = Callable[[dict, Int[Array, "B T"], Layout], Float[Array, "B T V"]]


def greedy_by_recompute(
    logits_fn: LogitsFn,
    params: dict,
    prompt_tokens: Int[Array, "B P"],
    prompt_mask: Int[Array, "B P"],
    prompt_control_flow: Int[Array, "B P"] | None,
    *,
    max_new_tokens: int,
    eos_id: int | None,
    pad_id: int,
) -> GenerateOutput:
    b, p = prompt_tokens.shape
    mask = jnp.concatenate([prompt_mask, jnp.ones((b, max_new_tokens), prompt_mask.dtype)], axis=1).astype(
        jnp.int32
    )
    if prompt_control_flow is None:
        prompt_control_flow = jnp.where(prompt_mask != 0, RECURRENT, 0)
    control_flow = jnp.concatenate(
        [prompt_control_flow * prompt_mask, jnp.full((b, max_new_tokens), RECURRENT, jnp.int32)], axis=1
    )
    layout = Layout(jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0), mask, control_flow.astype(jnp.int32))
    buffer = jnp.concatenate(
        [prompt_tokens.astype(jnp.int32), jnp.full((b, max_new_tokens), pad_id, jnp.int32)], 1
    )

    def body(i, state):
        buffer, done = state
        logits = jax.lax.dynamic_index_in_dim(
            logits_fn(params, buffer, layout), p + i - 1, axis=1, keepdims=False
        )
        nxt = jnp.where(done, pad_id, jnp.argmax(logits, axis=-1).astype(jnp.int32))
        if eos_id is not None:
            done = done | (nxt == eos_id)
        return jax.lax.dynamic_update_slice_in_dim(buffer, nxt[:, None], p + i, axis=1), done

    buffer, _ = jax.lax.fori_loop(0, max_new_tokens, body, (buffer, jnp.zeros((b,), bool)))
    return with_lengths(buffer[:, p:], eos_id)


def recompute_architecture(
    name: str, specs: dict, param_dtype: str, logits_fn: LogitsFn, **fields
) -> Architecture:
    """An architecture given only its causal forward `logits_fn(params, tokens, layout)`: `apply` runs it,
    `generate` re-runs it per token (`greedy_by_recompute`); `fields` are the other Architecture fields."""

    def apply(params, batch, *, training, rng, model_state, sample=None):
        return Outputs(logits_fn(params, batch["tokens"], layout_of(batch)))

    def generate(
        params,
        model_state,
        prompt,
        mask,
        control_flow,
        max_new_tokens,
        eos_id,
        pad_id,
        sampling=GREEDY,
        key=None,
    ):
        if sampling.temperature > 0:
            raise ValueError(f"{name} generates greedily only (eval.temperature 0), got {sampling}")
        return greedy_by_recompute(
            logits_fn, params, prompt, mask, control_flow, max_new_tokens=max_new_tokens, eos_id=eos_id,
            pad_id=pad_id,
        )  # fmt: skip

    return Architecture(name, specs, param_dtype, apply, generate, **fields)
