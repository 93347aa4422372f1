"""`gated` (the release default): x + P(tanh(γ_rec) g_rec ⊙ r + tanh(γ_in) g_in ⊙ x),
g = sigmoid(Linear([x ; r])), one gate projection per stream. Exactly x at init (γ = 0), unless
`recurrence.gamma_recurrent_init` starts γ_rec elsewhere (the release's rezero_gamma_recurrent_gate_init).

`gated_fixed`: the release's `gated` module with use_learnable_gate=False (its train_hotpotqa.sh). It then
builds no gate projections and its forward uses its default gates g_rec = 1, g_in = 0 (the wrapper passes
no recurrent_weight / orig_weight, so --recurrent_weight / --orig_weight change nothing):
x + P(tanh(γ_rec) r + 0 ⊙ x). γ_in stays a parameter, as in the release's state dict, but scales nothing."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from t2mlr_jax.architectures.t2mlr.mixers.common import gamma, gate_proj, linear, post, pre_norm, tanh_gamma
from t2mlr_jax.model.config import ModelConfig


def specs_fixed(cfg: ModelConfig) -> dict:
    return {
        "rezero_gamma_recurrent_gate": gamma(cfg, cfg.recurrence.gamma_recurrent_init),
        "rezero_gamma_input_gate": gamma(cfg),
    }


def specs(cfg: ModelConfig) -> dict:
    rec = cfg.recurrence
    return {
        **specs_fixed(cfg),
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
    stats = {"recurrent_gate": g_rec.mean(-1), "input_gate": g_in.mean(-1)}
    return _mixed(cfg, p, x, xn, rn, g_rec, g_in), stats


def mix_fixed(
    cfg: ModelConfig, p: dict, x: Float[Array, "B T D"], r: Float[Array, "B T D"]
) -> tuple[Float[Array, "B T D"], dict]:
    xn, rn = pre_norm(cfg, p, x, r)
    ones = jnp.ones(x.shape[:-1], x.dtype)
    return _mixed(cfg, p, x, xn, rn, 1.0, 0.0), {"recurrent_gate": ones, "input_gate": jnp.zeros_like(ones)}


def _mixed(cfg: ModelConfig, p: dict, x, xn, rn, g_rec, g_in) -> Float[Array, "B T D"]:
    """x + P(tanh(γ_rec) g_rec ⊙ r + tanh(γ_in) g_in ⊙ x)."""
    gamma_rec = tanh_gamma(p["rezero_gamma_recurrent_gate"], x.dtype)
    gamma_in = tanh_gamma(p["rezero_gamma_input_gate"], x.dtype)
    return x + post(cfg, gamma_rec * g_rec * rn + gamma_in * g_in * xn)
