"""The S5 LSTM baseline: embedding, a stack of LSTM layers, tied output head (the release's rnnlm).

Layer-major: each layer's input projection is one matmul over all time steps, then a `lax.scan` over
time carries (h, c). The state resets to zero at a document start (position 0), so packed rows work.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from t2mlr_jax.architectures.contract import Architecture, register_architecture
from t2mlr_jax.architectures.recompute import recompute_architecture
from t2mlr_jax.config.sections import Experiment, at_least
from t2mlr_jax.model import flops
from t2mlr_jax.model.spec import ParamSpec, normal
from t2mlr_jax.model.token_layout import Layout


def lstm_specs(*, vocab_size: int, hidden: int, layers: int) -> dict:
    """PyTorch's LSTM init, U(-1/sqrt(H), 1/sqrt(H)), for the cells; N(0, 1) embedding (nn.Embedding)."""
    bound = 1.0 / math.sqrt(hidden)
    uniform = lambda key, shape, dtype: jax.random.uniform(key, shape, dtype, -bound, bound)
    cell = ParamSpec((layers, hidden, 4 * hidden), ("layers", "embed", "mlp"), uniform, "matrix", 1)
    return {
        "embed_tokens": ParamSpec((vocab_size, hidden), ("vocab", "embed"), normal(1.0), "embedding"),
        "lstm": {
            "w_ih": cell,
            "w_hh": cell,
            "bias": ParamSpec((layers, 4 * hidden), ("layers", "mlp"), uniform, "bias"),
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


def _build(config: Experiment) -> Architecture:
    c = config.lstm
    specs = lstm_specs(vocab_size=config.model.vocab_size, hidden=c.hidden, layers=c.layers)
    # per position: every layer's input and recurrent matrices, then the tied head (hidden x vocab)
    per_position = flops.matrix_params(specs) + c.hidden * config.model.vocab_size
    return recompute_architecture(
        "lstm",
        specs,
        "float32",
        lstm_forward,
        train_flops=lambda seq_len: flops.train(2.0 * seq_len * per_position),
    )


@dataclasses.dataclass(frozen=True)
class LSTMSettings:
    """The LSTM baseline's size (config section `lstm`)."""

    hidden: int = 360
    layers: int = 4

    def __post_init__(self):
        at_least("lstm.hidden", self.hidden, 1)
        at_least("lstm.layers", self.layers, 1)


register_architecture("lstm", _build, settings=LSTMSettings)
