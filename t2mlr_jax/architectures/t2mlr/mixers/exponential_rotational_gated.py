"""`exponential_rotational_gated`: P(a x + sqrt(1 - a² + 1e-8) i ⊙ r) with the decay
a = exp(-8 softplus(Λ) sigmoid(W_a x)) and the input gate i = sigmoid(W_i x); both gates read x only (the
release default). Λ = log(p^(-1/8) - 1), p ~ U[0.99, 0.999], so a = p^gate at init."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from t2mlr_jax.architectures.t2mlr.mixers.common import linear, post, pre_norm, square_linear
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.spec import ParamSpec


def _decay_rates(key, shape, dtype):
    p = jax.random.uniform(key, shape, jnp.float32, 0.99, 0.999)
    return jnp.log(p ** (-1.0 / 8.0) - 1.0)


def specs(cfg: ModelConfig) -> dict:
    return {
        "erg_r_proj": square_linear(cfg, ("embed", "mixer_out")),
        "erg_i_proj": square_linear(cfg, ("embed", "mixer_out")),
        "erg_lambda_param": ParamSpec((cfg.hidden_size,), ("norm",), _decay_rates, "scalar", dtype="float32"),
    }


def mix(
    cfg: ModelConfig, p: dict, x: Float[Array, "B T D"], r: Float[Array, "B T D"]
) -> tuple[Float[Array, "B T D"], dict]:
    xn, rn = pre_norm(cfg, p, x, r)
    gate_r = jax.nn.sigmoid(linear(p["erg_r_proj"], xn))
    gate_i = jax.nn.sigmoid(linear(p["erg_i_proj"], xn))
    a = jnp.exp(-8.0 * jax.nn.softplus(p["erg_lambda_param"]) * gate_r.astype(jnp.float32))
    coeff = jnp.sqrt(1.0 - a * a + 1e-8)
    out = post(cfg, a.astype(x.dtype) * xn + coeff.astype(x.dtype) * gate_i * rn)
    return out, {"recurrent_gate": gate_i.mean(-1), "decay": a.mean(-1)}
