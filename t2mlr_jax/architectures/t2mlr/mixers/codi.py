"""`codi`: P(LayerNorm(Linear(GELU(Linear(r))))), the fused stream replaced by a projected cache (the
CODI-style baseline; exact GELU, LayerNorm eps 1e-5 in fp32). The MLP's hidden width is the release's
`bottleneck_size` (RecurrenceConfig.bottleneck_size; None = hidden_size)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from t2mlr_jax.architectures.t2mlr.mixers.common import dense, linear, post, pre_norm
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.spec import ParamSpec, ones, zeros


def specs(cfg: ModelConfig) -> dict:
    d = cfg.hidden_size
    width = cfg.recurrence.bottleneck_size or d
    return {
        "codi_projection": {
            "fc1": dense(d, width, ("embed", "mixer_out")),
            "fc2": dense(width, d, ("mixer_out", "embed")),
            "norm": {
                "scale": ParamSpec((d,), ("norm",), ones, "norm"),
                "bias": ParamSpec((d,), ("norm",), zeros, "bias"),
            },
        }
    }


def mix(
    cfg: ModelConfig, p: dict, x: Float[Array, "B T D"], r: Float[Array, "B T D"]
) -> tuple[Float[Array, "B T D"], dict]:
    q = p["codi_projection"]
    z = linear(q["fc2"], jax.nn.gelu(linear(q["fc1"], pre_norm(cfg, p, x, r)[1]), approximate=False))
    z32 = z.astype(jnp.float32)
    z32 = (z32 - z32.mean(-1, keepdims=True)) * jax.lax.rsqrt(z32.var(-1, keepdims=True) + 1e-5)
    return post(cfg, (z32 * q["norm"]["scale"] + q["norm"]["bias"]).astype(x.dtype)), {}
