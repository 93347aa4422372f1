"""The two T²MLR-specific functions every mode shares: `fuse` (the gate zoo) and `update_cache`.

fuse:          the stream entering block l_start becomes Phi(x, R) at recurrent positions (control flow 2).
update_cache:  R_t from the stream after block l_end, with the optional temporal residual and rescale.

Mixers (release names; `gated` is the default):
  gated             x + P(tanh(γ_rec) g_rec ⊙ r + tanh(γ_in) g_in ⊙ x),  g = sigmoid(Linear([x ; r]))
  none              x
  constant_weight   (1 - α) x + α r,  α = clip(learnable α, 0, 1)
  concat            W_c [x ; r],  W_c initialised to [I | 0]
  var_norm_gated    x + tanh(γ) P(sqrt(α) r + sqrt(1 - α) x),  α = sigmoid(Linear([x ; r]))
  alpha_coupled     x + tanh(γ) P(α r + (1 - α) x)
  exponential_rotational_gated   P(a x + sqrt(1 - a² + 1e-8) i ⊙ r),  a = exp(-8 softplus(Λ) sigmoid(W_a x)),
                                 i = sigmoid(W_i x)   (gates read x only, the release default)
  coconut           P(r)                                   (out = R: Coconut-style baseline)
  codi              P(LayerNorm(Linear(GELU(Linear(r)))))  (CODI-style baseline)
where r = W_rec R for the gated family and concat (optional), pre-norm optionally RMS-normalises both
streams first, and P is the optional clamped RMS rescale (`post_norm`). γ are fp32 and start at 0, so
gated / var_norm_gated / alpha_coupled / none (and concat without pre-norm) are exactly x at init.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from t2mlr_jax.model.config import PROJECTED_MIXERS, ModelConfig
from t2mlr_jax.model.layers import rms_norm
from t2mlr_jax.model.spec import ParamSpec, ones, zeros
from t2mlr_jax.parallel.rules import RESIDUAL_AXES, constrain

RECURRENT = 2  # control flow: 0 pad, 1 prompt / non-recurrent, 2 recurrent


def _xavier_normal(gain: float):
    """torch.nn.init.xavier_normal_ on a [in, out] kernel; gain 0 gives zeros."""

    def init(key, shape, dtype):
        std = gain * math.sqrt(2.0 / (shape[0] + shape[1]))
        return std * jax.random.normal(key, shape, dtype)

    return init


def _torch_uniform(fan_in: int):
    """PyTorch's default Linear init (weights and biases): U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    bound = 1.0 / math.sqrt(fan_in)
    return lambda key, shape, dtype: jax.random.uniform(key, shape, dtype, -bound, bound)


def _gate_bias(prob: float | None, fan_in: int):
    """Bias = logit(prob) when an initial gate value is given, else PyTorch's default uniform."""
    if prob is None:
        return _torch_uniform(fan_in)
    p = min(max(float(prob), 1e-4), 1 - 1e-4)
    return lambda key, shape, dtype: jnp.full(shape, math.log(p / (1 - p)), dtype)


def _concat_identity(key, shape, dtype):
    d = shape[1]
    return jnp.concatenate([jnp.eye(d, dtype=dtype), jnp.zeros((d, d), dtype)], axis=0)


def _erg_lambda(key, shape, dtype):
    """Λ = log(p^(-1/8) - 1), p ~ U[0.99, 0.999]: decay a = p^gate at init (release's ERG mixer)."""
    p = jax.random.uniform(key, shape, jnp.float32, 0.99, 0.999)
    return jnp.log(p ** (-1.0 / 8.0) - 1.0)


def mixer_specs(cfg: ModelConfig) -> dict:
    """The fusion parameters, named after the release's state_dict keys."""
    rec, d = cfg.recurrence, cfg.hidden_size
    gamma_shape = (d,) if rec.gamma_per_channel else (1,)
    gamma_axes = ("norm",) if rec.gamma_per_channel else (None,)
    gamma = ParamSpec(gamma_shape, gamma_axes, zeros, "gate", dtype="float32")
    gate = {
        "kernel": ParamSpec(
            (2 * d, d), ("mixer_in", "embed"), _xavier_normal(rec.gate_weight_init_std), "matrix", 1
        )
    }

    def gate_proj(prob):
        return {**gate, "bias": ParamSpec((d,), ("norm",), _gate_bias(prob, 2 * d), "bias")}

    specs: dict = {}
    if rec.recurrent_projection and rec.mixer in PROJECTED_MIXERS:
        specs["recurrent_projection"] = ParamSpec(
            (d, d), ("embed", "mixer_out"), _torch_uniform(d), "matrix", 1
        )
    if rec.pre_norm:
        specs["norm_x"] = ParamSpec((d,), ("norm",), ones, "norm")
        specs["norm_r"] = ParamSpec((d,), ("norm",), ones, "norm")
    if rec.cache_norm == "rmsnorm":
        specs["cache_norm"] = ParamSpec((d,), ("norm",), ones, "norm")
    if rec.mixer == "gated":
        specs["rezero_gamma_recurrent_gate"] = ParamSpec(
            gamma_shape, gamma_axes, zeros, "gate", dtype="float32"
        )
        specs["rezero_gamma_input_gate"] = ParamSpec(gamma_shape, gamma_axes, zeros, "gate", dtype="float32")
        specs["recurrent_gate_proj"] = gate_proj(rec.recurrent_gate_init)
        specs["input_gate_proj"] = gate_proj(rec.input_gate_init)
    elif rec.mixer in ("var_norm_gated", "alpha_coupled"):
        specs["rezero_gamma"] = gamma
        specs["alpha_gate_proj"] = gate_proj(rec.recurrent_gate_init)
    elif rec.mixer == "constant_weight":
        specs["recurrent_alpha"] = ParamSpec(
            (1,), (None,), lambda k, s, t: jnp.full(s, rec.constant_alpha, t), "scalar"
        )
    elif rec.mixer == "concat":
        specs["concat_projection"] = ParamSpec(
            (2 * d, d), ("mixer_in", "embed"), _concat_identity, "matrix", 1
        )
    elif rec.mixer == "exponential_rotational_gated":
        for name in ("erg_r_proj", "erg_i_proj"):
            specs[name] = {
                "kernel": ParamSpec((d, d), ("embed", "mixer_out"), _torch_uniform(d), "matrix", 1),
                "bias": ParamSpec((d,), ("norm",), _torch_uniform(d), "bias"),
            }
        specs["erg_lambda_param"] = ParamSpec((d,), ("norm",), _erg_lambda, "scalar", dtype="float32")
    elif rec.mixer == "codi":
        specs["codi_projection"] = {
            "fc1": {
                "kernel": ParamSpec((d, d), ("embed", "mixer_out"), _torch_uniform(d), "matrix", 1),
                "bias": ParamSpec((d,), ("norm",), _torch_uniform(d), "bias"),
            },
            "fc2": {
                "kernel": ParamSpec((d, d), ("mixer_out", "embed"), _torch_uniform(d), "matrix", 1),
                "bias": ParamSpec((d,), ("norm",), _torch_uniform(d), "bias"),
            },
            "norm": {
                "scale": ParamSpec((d,), ("norm",), ones, "norm"),
                "bias": ParamSpec((d,), ("norm",), zeros, "bias"),
            },
        }
    return specs


def _linear(p: dict, x):
    return jnp.einsum("...i,io->...o", x, p["kernel"].astype(x.dtype)) + p["bias"].astype(x.dtype)


def _post_rescale(y, clamp: float, eps: float = 1e-6):
    """y * stop_gradient(clip(1/rms(y), 1/c, c)) in fp32: bounds a stream's scale without a learned weight."""
    y32 = jax.lax.stop_gradient(y.astype(jnp.float32))
    c = max(clamp, 1.0)
    scale = jnp.clip(jax.lax.rsqrt(jnp.mean(y32 * y32, axis=-1, keepdims=True) + eps), 1.0 / c, c)
    return y * scale.astype(y.dtype)


def _tanh_gamma(gamma, dtype):
    return jnp.tanh(gamma.astype(jnp.float32)).astype(dtype)


def _mix(cfg: ModelConfig, p: dict, x, big_r):
    """Phi(x, R) for every position (masking to recurrent positions is done by `fuse`)."""
    rec = cfg.recurrence
    r = big_r
    if "recurrent_projection" in p:
        # Back to the residual stream's layout before mixing with x (XLA's SPMD partitioner computed
        # wrong values on a (2,2,2) mesh when the tensor-sharded projection output met x unconstrained).
        r = constrain(jnp.einsum("btd,de->bte", r, p["recurrent_projection"].astype(x.dtype)), RESIDUAL_AXES)
    xn, rn = x, r
    if rec.pre_norm:
        eps = float(jnp.finfo(x.dtype).eps)  # torch.nn.RMSNorm(eps=None)
        xn, rn = rms_norm(x, p["norm_x"].astype(x.dtype), eps), rms_norm(r, p["norm_r"].astype(x.dtype), eps)

    def post(y):
        return _post_rescale(y, rec.post_norm_clamp) if rec.post_norm else y

    name, stats = rec.mixer, {}
    if name == "none":
        return x, stats
    if name == "constant_weight":
        alpha = jnp.clip(p["recurrent_alpha"], 0.0, 1.0).astype(x.dtype)
        return (1 - alpha) * xn + alpha * rn, {"recurrent_gate": alpha[0]}
    if name == "concat":
        return jnp.einsum(
            "...i,io->...o", jnp.concatenate([xn, rn], -1), p["concat_projection"].astype(x.dtype)
        ), stats
    if name == "coconut":
        return post(rn), stats
    if name == "codi":
        q = p["codi_projection"]
        z = _linear(q["fc2"], jax.nn.gelu(_linear(q["fc1"], rn), approximate=False))
        z32 = z.astype(jnp.float32)
        z32 = (z32 - z32.mean(-1, keepdims=True)) * jax.lax.rsqrt(z32.var(-1, keepdims=True) + 1e-5)
        z = (z32 * q["norm"]["scale"] + q["norm"]["bias"]).astype(x.dtype)
        return post(z), stats
    if name == "exponential_rotational_gated":
        gate_r = jax.nn.sigmoid(_linear(p["erg_r_proj"], xn))
        gate_i = jax.nn.sigmoid(_linear(p["erg_i_proj"], xn))
        a = jnp.exp(-8.0 * jax.nn.softplus(p["erg_lambda_param"]) * gate_r.astype(jnp.float32))
        coeff = jnp.sqrt(1.0 - a * a + 1e-8)
        out = post(a.astype(x.dtype) * xn + coeff.astype(x.dtype) * gate_i * rn)
        return out, {"recurrent_gate": gate_i.mean(-1), "decay": a.mean(-1)}
    both = jnp.concatenate([xn, rn], axis=-1)  # [x ; r], x first (release order)
    if name == "gated":
        g_rec = jax.nn.sigmoid(_linear(p["recurrent_gate_proj"], both))
        g_in = jax.nn.sigmoid(_linear(p["input_gate_proj"], both))
        y = (
            _tanh_gamma(p["rezero_gamma_recurrent_gate"], x.dtype) * g_rec * rn
            + _tanh_gamma(p["rezero_gamma_input_gate"], x.dtype) * g_in * xn
        )
        return x + post(y), {"recurrent_gate": g_rec.mean(-1), "input_gate": g_in.mean(-1)}
    alpha = jnp.clip(jax.nn.sigmoid(_linear(p["alpha_gate_proj"], both).astype(jnp.float32)), 1e-4, 1 - 1e-4)
    if name == "var_norm_gated":
        g_rec, g_in = jnp.sqrt(alpha), jnp.sqrt(1 - alpha)
    else:  # alpha_coupled
        g_rec, g_in = alpha, 1 - alpha
    y = post(g_rec.astype(x.dtype) * rn + g_in.astype(x.dtype) * xn)
    return x + _tanh_gamma(p["rezero_gamma"], x.dtype) * y, {"recurrent_gate": alpha.mean(-1)}


def fuse(
    cfg: ModelConfig,
    mixer_params: dict,
    x: Float[Array, "B T D"],
    big_r: Float[Array, "B T D"],
    control_flow: Int[Array, "B T"],
) -> tuple[Float[Array, "B T D"], dict]:
    """The stream entering block l_start: Phi(x, R) where control flow is recurrent, x elsewhere.

    Returns the fused stream and per-token gate statistics (zero at non-recurrent positions).
    """
    mixed, stats = _mix(cfg, mixer_params, x, big_r.astype(x.dtype))
    recurrent = control_flow >= RECURRENT
    stats = {k: jnp.where(recurrent, jnp.broadcast_to(v, recurrent.shape), 0.0) for k, v in stats.items()}
    return constrain(jnp.where(recurrent[..., None], mixed.astype(x.dtype), x), RESIDUAL_AXES), stats


def update_cache(
    cfg: ModelConfig,
    mixer_params: dict,
    h_end: Float[Array, "B T D"],
    big_r: Float[Array, "B T D"],
    control_flow: Int[Array, "B T"],
) -> Float[Array, "B T D"]:
    """R_t from the stream after block l_end (h_end) and the cache R_{t-1} this token was fused with.

    Raw h_end (release default), or with the temporal residual N(h_end + w R_{t-1}) at recurrent
    positions, N the clamped stop-gradient RMS rescale (or the paper's learnable RMSNorm), in fp32.
    """
    rec = cfg.recurrence
    if not rec.temporal_residual:
        return h_end
    prev = jax.lax.stop_gradient(big_r) if rec.temporal_residual_detach else big_r
    y = h_end.astype(jnp.float32) + rec.temporal_residual_weight * prev.astype(jnp.float32)
    if rec.cache_norm == "rescale":
        y = _post_rescale(y, rec.cache_norm_clamp, rec.cache_norm_eps)
    elif rec.cache_norm == "rmsnorm":
        y = rms_norm(y, mixer_params["cache_norm"], rec.cache_norm_eps)
    recurrent = (control_flow >= RECURRENT)[..., None]
    return jnp.where(recurrent, y.astype(h_end.dtype), h_end)


def gamma_stats(cfg: ModelConfig, mixer_params: dict) -> dict:
    """tanh of the ReZero gammas (the paper's Fig. 8 trajectories), as fp32 scalars (means if per-channel)."""
    return {
        f"tanh_{k}": jnp.tanh(v.astype(jnp.float32)).mean()
        for k, v in mixer_params.items()
        if k.startswith("rezero_gamma")
    }
