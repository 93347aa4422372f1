"""The two T²MLR-specific functions every mode shares: `fuse` (a mixer of the gate zoo) and `update_cache`.

fuse:          the stream entering block l_start becomes Phi(x, R) at recurrent positions (control flow 2).
update_cache:  R_t from the stream after block l_end, with the optional temporal residual and rescale.

Phi is the mixer named by `RecurrenceConfig.mixer`, looked up in `mixers.MIXERS`. The
pieces every mixer shares are applied here: r = W_rec R (`recurrent_projection`, for mixers that use it)
before the mixer, and the parameters of W_rec, the streams' pre-norm and the learnable cache RMSNorm.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from t2mlr_jax.architectures.t2mlr.mixers import MIXERS
from t2mlr_jax.architectures.t2mlr.mixers.common import post_rescale, torch_uniform
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.control_flow import RECURRENT
from t2mlr_jax.model.layers import rms_norm
from t2mlr_jax.model.spec import ParamSpec, ones
from t2mlr_jax.parallel.rules import RESIDUAL_AXES, constrain


def mixer_specs(cfg: ModelConfig) -> dict:
    """The fusion parameters (the `mixer` subtree), named after the release's state_dict keys."""
    rec, d = cfg.recurrence, cfg.hidden_size
    mixer = MIXERS.get(rec.mixer)
    specs: dict = {}
    if rec.recurrent_projection and mixer.recurrent_projection:
        specs["recurrent_projection"] = ParamSpec(
            (d, d), ("embed", "mixer_out"), torch_uniform(d), "matrix", 1
        )
    if rec.pre_norm:
        specs["norm_x"] = ParamSpec((d,), ("norm",), ones, "norm")
        specs["norm_r"] = ParamSpec((d,), ("norm",), ones, "norm")
    if rec.cache_norm == "rmsnorm":
        specs["cache_norm"] = ParamSpec((d,), ("norm",), ones, "norm")
    return {**specs, **mixer.specs(cfg)}


def fuse(
    cfg: ModelConfig,
    mixer_params: dict,
    x: Float[Array, "B T D"],
    big_r: Float[Array, "B T D"],
    control_flow: Int[Array, "B T"],
    positions: Int[Array, "B T"] | None = None,
) -> tuple[Float[Array, "B T D"], dict]:
    """The stream entering block l_start: Phi(x, R) where control flow is recurrent, x elsewhere.

    Returns the fused stream and per-token gate statistics (zero at non-recurrent positions).
    `positions` reach the mixers that read them (`Mixer.positional`).
    """
    r = big_r.astype(x.dtype)
    if "recurrent_projection" in mixer_params:
        # Back to the residual stream's layout before mixing with x (XLA's SPMD partitioner computed
        # wrong values on a (2,2,2) mesh when the tensor-sharded projection output met x unconstrained).
        projection = mixer_params["recurrent_projection"].astype(x.dtype)
        r = constrain(jnp.einsum("btd,de->bte", r, projection), RESIDUAL_AXES)
    mixer = MIXERS.get(cfg.recurrence.mixer)
    if mixer.positional:
        mixed, stats = mixer.mix(cfg, mixer_params, x, r, positions=positions)
    else:
        mixed, stats = mixer.mix(cfg, mixer_params, x, r)
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
        y = post_rescale(y, rec.cache_norm_clamp, rec.cache_norm_eps)
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
