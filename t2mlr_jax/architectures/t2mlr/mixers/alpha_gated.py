"""One gate α = clip(sigmoid(Linear([x ; r])), 1e-4, 1 - 1e-4) (fp32) for both streams, the mixed-in term
scaled by one ReZero gamma: x + tanh(γ) P(g_rec(α) r + g_in(α) x). Exactly x at init (γ = 0).

  var_norm_gated   g_rec = sqrt(α), g_in = sqrt(1 - α)   (variance-preserving)
  alpha_coupled    g_rec = α,       g_in = 1 - α

The gate's bias starts at logit(recurrent_gate_init); when that is None, var_norm_gated starts at the
release's logit(0.2) and alpha_coupled at PyTorch's default (random), as their release modules do.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from t2mlr_jax.architectures.t2mlr.mixers.common import gamma, gate_proj, linear, post, pre_norm, tanh_gamma
from t2mlr_jax.model.config import ModelConfig

VAR_NORM_GATE_INIT = 0.2  # the release's T2MLR_VarNorm_Gated_Mixing_Module default


def specs(cfg: ModelConfig, default_gate_init: float | None = None) -> dict:
    init = cfg.recurrence.recurrent_gate_init
    return {
        "rezero_gamma": gamma(cfg),
        "alpha_gate_proj": gate_proj(cfg, default_gate_init if init is None else init),
    }


def specs_var_norm_gated(cfg: ModelConfig) -> dict:
    return specs(cfg, VAR_NORM_GATE_INIT)


def _mix(cfg: ModelConfig, p: dict, x, r, gates: Callable) -> tuple:
    xn, rn = pre_norm(cfg, p, x, r)
    both = jnp.concatenate([xn, rn], axis=-1)  # [x ; r], x first (release order)
    alpha = jnp.clip(jax.nn.sigmoid(linear(p["alpha_gate_proj"], both).astype(jnp.float32)), 1e-4, 1 - 1e-4)
    g_rec, g_in = gates(alpha)
    y = post(cfg, g_rec.astype(x.dtype) * rn + g_in.astype(x.dtype) * xn)
    return x + tanh_gamma(p["rezero_gamma"], x.dtype) * y, {"recurrent_gate": alpha.mean(-1)}


def mix_var_norm_gated(
    cfg: ModelConfig, p: dict, x: Float[Array, "B T D"], r: Float[Array, "B T D"]
) -> tuple[Float[Array, "B T D"], dict]:
    return _mix(cfg, p, x, r, lambda alpha: (jnp.sqrt(alpha), jnp.sqrt(1 - alpha)))


def mix_alpha_coupled(
    cfg: ModelConfig, p: dict, x: Float[Array, "B T D"], r: Float[Array, "B T D"]
) -> tuple[Float[Array, "B T D"], dict]:
    return _mix(cfg, p, x, r, lambda alpha: (alpha, 1 - alpha))
