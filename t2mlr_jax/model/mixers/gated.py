"""`gated` (the release default): x + P(tanh(γ_rec) g_rec ⊙ r + tanh(γ_in) g_in ⊙ x),
g = sigmoid(Linear([x ; r])), one gate projection per stream. Exactly x at init (γ = 0), unless
`recurrence.gamma_recurrent_init` starts γ_rec elsewhere (the release's rezero_gamma_recurrent_gate_init)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.mixers.common import gamma, gate_proj, linear, post, pre_norm, tanh_gamma


def specs(cfg: ModelConfig) -> dict:
    rec = cfg.recurrence
    return {
        "rezero_gamma_recurrent_gate": gamma(cfg, rec.gamma_recurrent_init),
        "rezero_gamma_input_gate": gamma(cfg),
        "recurrent_gate_proj": gate_proj(cfg, rec.recurrent_gate_init),
        "input_gate_proj": gate_proj(cfg, rec.input_gate_init),
    }


def mix(
    cfg: ModelConfig, p: dict, x: Float[Array, "B T D"], r: Float[Array, "B T D"]
) -> tuple[Float[Array, "B T D"], dict]:
    xn, rn = pre_norm(cfg, p, x, r)
    both = jnp.concatenate([xn, rn], axis=-1)  # [x ; r], x first (release order)
    g_rec = jax.nn.sigmoid(linear(p["recurrent_gate_proj"], both))
    g_in = jax.nn.sigmoid(linear(p["input_gate_proj"], both))
    y = (
        tanh_gamma(p["rezero_gamma_recurrent_gate"], x.dtype) * g_rec * rn
        + tanh_gamma(p["rezero_gamma_input_gate"], x.dtype) * g_in * xn
    )
    return x + post(cfg, y), {"recurrent_gate": g_rec.mean(-1), "input_gate": g_in.mean(-1)}
