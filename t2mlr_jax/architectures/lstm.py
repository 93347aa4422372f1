"""The S5 LSTM baseline: embedding, a stack of LSTM layers, tied output head (the release's rnnlm).

Layer-major: each layer's input projection is one matmul over all time steps, then a `lax.scan` over
time carries (h, c). The state resets to zero at a document start (position 0), so packed rows work.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from t2mlr_jax.model.recurrence import Layout


def init_lstm(key: jax.Array, *, vocab_size: int, hidden: int, layers: int) -> dict:
    """PyTorch's LSTM init, U(-1/sqrt(H), 1/sqrt(H)), for the cells; N(0, 1) embedding (nn.Embedding)."""
    k_embed, k_ih, k_hh, k_b = jax.random.split(key, 4)
    bound = 1.0 / math.sqrt(hidden)
    uniform = lambda k, shape: jax.random.uniform(k, shape, jnp.float32, -bound, bound)
    return {
        "embed_tokens": jax.random.normal(k_embed, (vocab_size, hidden), jnp.float32),
        "lstm": {
            "w_ih": uniform(k_ih, (layers, hidden, 4 * hidden)),
            "w_hh": uniform(k_hh, (layers, hidden, 4 * hidden)),
            "bias": uniform(k_b, (layers, 4 * hidden)),
        },
    }


def lstm_forward(params: dict, tokens: Int[Array, "B T"], layout: Layout) -> Float[Array, "B T V"]:
    x = jnp.take(params["embed_tokens"], tokens, axis=0)
    reset = jnp.swapaxes(layout.positions == 0, 0, 1)[..., None]  # T B 1

    def layer(x, p):
        gates_in = jnp.swapaxes(x @ p["w_ih"] + p["bias"], 0, 1)  # T B 4H

        def step(carry, inputs):
            h, c = carry
            g, r = inputs
            h, c = jnp.where(r, 0.0, h), jnp.where(r, 0.0, c)
            i, f, u, o = jnp.split(g + h @ p["w_hh"], 4, axis=-1)
            c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(u)
            h = jax.nn.sigmoid(o) * jnp.tanh(c)
            return (h, c), h

        zeros = jnp.zeros(gates_in.shape[1:2] + (p["w_hh"].shape[0],), x.dtype)
        _, hs = jax.lax.scan(step, (zeros, zeros), (gates_in, reset))
        return jnp.swapaxes(hs, 0, 1), None

    x, _ = jax.lax.scan(layer, x, params["lstm"])
    return jnp.einsum("bth,vh->btv", x, params["embed_tokens"], preferred_element_type=jnp.float32)
