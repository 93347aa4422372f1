"""What the mixers' JAX code shares: initialisers, the gate projection, Linear, the streams' pre-norm,
the clamped post rescale and the ReZero gammas."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.layers import rms_norm
from t2mlr_jax.model.spec import Init, ParamSpec, constant, zeros


def xavier_normal(gain: float) -> Init:
    """torch.nn.init.xavier_normal_ on a [in, out] kernel; gain 0 gives zeros."""

    def init(key, shape, dtype):
        std = gain * math.sqrt(2.0 / (shape[0] + shape[1]))
        return std * jax.random.normal(key, shape, dtype)

    return init


def torch_uniform(fan_in: int) -> Init:
    """PyTorch's default Linear init (weights and biases): U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    bound = 1.0 / math.sqrt(fan_in)
    return lambda key, shape, dtype: jax.random.uniform(key, shape, dtype, -bound, bound)


def _gate_bias(prob: float | None, fan_in: int) -> Init:
    """Bias = logit(prob) when an initial gate value is given, else PyTorch's default uniform."""
    if prob is None:
        return torch_uniform(fan_in)
    p = min(max(float(prob), 1e-4), 1 - 1e-4)
    return lambda key, shape, dtype: jnp.full(shape, math.log(p / (1 - p)), dtype)


def gate_proj(cfg: ModelConfig, prob: float | None) -> dict:
    """A gate's Linear([x ; r]) -> D: xavier-normal kernel (gain `gate_weight_init_std`), bias logit(prob)
    (PyTorch's default when prob is None)."""
    d = cfg.hidden_size
    kernel_init = xavier_normal(cfg.recurrence.gate_weight_init_std)
    return {
        "kernel": ParamSpec((2 * d, d), ("mixer_in", "embed"), kernel_init, "matrix", 1),
        "bias": ParamSpec((d,), ("norm",), _gate_bias(prob, 2 * d), "bias"),
    }


def square_linear(cfg: ModelConfig, axes: tuple[str, str]) -> dict:
    """A D -> D Linear with a bias, PyTorch's default init."""
    return dense(cfg.hidden_size, cfg.hidden_size, axes)


def dense(fan_in: int, fan_out: int, axes: tuple[str, str]) -> dict:
    """A fan_in -> fan_out Linear with a bias, PyTorch's default init."""
    return {
        "kernel": ParamSpec((fan_in, fan_out), axes, torch_uniform(fan_in), "matrix", 1),
        "bias": ParamSpec((fan_out,), ("norm",), torch_uniform(fan_in), "bias"),
    }


def gamma(cfg: ModelConfig, init: float = 0.0) -> ParamSpec:
    """A ReZero gamma: fp32, `init` (0 by default) at init; one scalar, or one per channel
    (`gamma_per_channel`)."""
    fill = constant(float(init)) if init else zeros
    if cfg.recurrence.gamma_per_channel:
        return ParamSpec((cfg.hidden_size,), ("norm",), fill, "gate", dtype="float32")
    return ParamSpec((1,), (None,), fill, "gate", dtype="float32")


def tanh_gamma(g: Float[Array, " G"], dtype) -> Float[Array, " G"]:
    return jnp.tanh(g.astype(jnp.float32)).astype(dtype)


def linear(p: dict, x: Float[Array, "*B I"]) -> Float[Array, "*B O"]:
    return jnp.einsum("...i,io->...o", x, p["kernel"].astype(x.dtype)) + p["bias"].astype(x.dtype)


def post_rescale(y: Float[Array, "*B D"], clamp: float, eps: float = 1e-6) -> Float[Array, "*B D"]:
    """y * stop_gradient(clip(1/rms(y), 1/c, c)) in fp32: bounds a stream's scale without a learned weight."""
    y32 = jax.lax.stop_gradient(y.astype(jnp.float32))
    c = max(clamp, 1.0)
    scale = jnp.clip(jax.lax.rsqrt(jnp.mean(y32 * y32, axis=-1, keepdims=True) + eps), 1.0 / c, c)
    return y * scale.astype(y.dtype)


def post(cfg: ModelConfig, y: Float[Array, "*B D"]) -> Float[Array, "*B D"]:
    """P: the clamped RMS rescale of a mixed-in term when `post_norm` is on, the identity otherwise."""
    rec = cfg.recurrence
    return post_rescale(y, rec.post_norm_clamp) if rec.post_norm else y


def pre_norm(
    cfg: ModelConfig, p: dict, x: Float[Array, "B T D"], r: Float[Array, "B T D"]
) -> tuple[Float[Array, "B T D"], Float[Array, "B T D"]]:
    """Both streams RMS-normalised (torch.nn.RMSNorm, eps = the dtype's epsilon) when `pre_norm` is on."""
    if not cfg.recurrence.pre_norm:
        return x, r
    eps = float(jnp.finfo(x.dtype).eps)
    return rms_norm(x, p["norm_x"].astype(x.dtype), eps), rms_norm(r, p["norm_r"].astype(x.dtype), eps)
