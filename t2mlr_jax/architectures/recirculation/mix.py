"""Recirculation's mix (Mozer et al., Eq. 1-2): a deep state z_src folded into a shallower one z_dest,
z_new = alpha * f(z_src) + beta * z_dest, per token, with no parameters.

Schemes (the paper's set):
  none        f(z) = z, beta = 1 - alpha
  ratio       f(z) = (|z_dest| / |z_src|) z, beta = 1 - alpha (the paper's default)
  nonconvex   ratio's f, beta = 1 (larger models need it)
  renorm      ratio's convex mix, rescaled to |z_dest|
  orthogonal  z_dest + alpha * (the part of ratio's f(z_src) orthogonal to z_dest)
  slerp       spherical interpolation from z_dest toward z_src by alpha, at |z_dest|
`ramp` scales alpha by min(t / 10, 1) at position t (the paper's help for early tokens).
`Recirculation` names where (source and destination blocks) and how (alpha, scheme, ramp).
Adaptive (the paper's learned variant): per-channel alpha, beta = sigmoid(MLP([z_src; z_dest])), a
2-hidden-layer GELU MLP whose output starts at alpha 0.1, beta 0.9; z_new = alpha f(z_src) + beta z_dest
with ratio's f. The MLP reads both states RMS-normalised (our choice: raw residual streams reach norms in
the hundreds, and the first AdamW step over them sent SmolLM2's loss from 3.8 to 9.4).

Every scheme at alpha = 0 returns z_dest bit for bit: each is written as z_dest times a coefficient that
is exactly 1 there, plus a term multiplied by alpha (a zero-norm z_src cannot turn that term into NaN).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from t2mlr_jax.model.spec import ParamSpec, normal, zeros

SCHEMES = ("none", "ratio", "nonconvex", "renorm", "orthogonal", "slerp")
CONVEX = ("none", "ratio", "renorm", "slerp")  # alpha is a mixing weight: it must lie in (0, 1]
RAMP_POSITIONS = 10
ADAPTIVE_INIT = (0.1, 0.9)  # the adaptive MLP's alpha and beta at initialisation
_EPS = 1e-12


def check_mix(scheme: str, alpha: float) -> None:
    """One clear error for a scheme we do not know or an alpha the scheme cannot take."""
    if scheme not in SCHEMES:
        raise ValueError(f"recirculation scheme must be one of {SCHEMES}, got {scheme!r}")
    if scheme in CONVEX and not 0.0 < alpha <= 1.0:
        raise ValueError(
            f"recirculation alpha must be in (0, 1] for the convex scheme {scheme!r}, got {alpha}"
        )
    if alpha < 0.0:
        raise ValueError(f"recirculation alpha must be >= 0, got {alpha}")


@dataclasses.dataclass(frozen=True)
class Recirculation:
    """The deep state z_src = the output of block `source` folded into z_dest = the output of block
    `destination` (0-based blocks; HF hidden_states[source + 1] into hidden_states[destination + 1]), so
    the recirculated blocks are destination + 1 .. source. Hashable: a static argument of jit."""

    source: int
    destination: int
    alpha: float | Float[Array, ""] = 0.1  # a traced alpha inside jit (one compile for a sweep's alphas)
    scheme: str = "ratio"
    ramp: bool = False
    adaptive: bool = False  # alpha, beta from the adaptive MLP (its params passed to the call); no scheme

    def check(self, num_layers: int) -> None:
        """One clear error for a pair that is not deep-to-shallow inside the model, or a bad mix."""
        if not 0 <= self.source < num_layers or not 0 <= self.destination < num_layers:
            raise ValueError(
                f"recirculation source {self.source} and destination {self.destination} must be blocks "
                f"0..{num_layers - 1} of this {num_layers}-layer model"
            )
        if self.source <= self.destination:
            raise ValueError(
                f"recirculation source ({self.source}) must be deeper than destination ({self.destination})"
            )
        check_mix(self.scheme, self.alpha)

    def __call__(
        self,
        z_dest: Float[Array, "B T D"],
        z_src: Float[Array, "B T D"],
        positions: Int[Array, "B T"] | None,
        mlp: dict | None = None,
    ) -> Float[Array, "B T D"]:
        ramp = positions if self.ramp else None
        if self.adaptive:
            return adaptive_mix(mlp, z_dest, z_src, positions=ramp)
        return mix(z_dest, z_src, self.alpha, scheme=self.scheme, positions=ramp)


def mix(
    z_dest: Float[Array, "B T D"],
    z_src: Float[Array, "B T D"],
    alpha: float | Float[Array, ""],
    *,
    scheme: str = "ratio",
    positions: Int[Array, "B T"] | None = None,
) -> Float[Array, "B T D"]:
    """z_src folded into z_dest by `scheme`; with `positions`, alpha ramps up over the first ten."""
    alpha = jnp.asarray(alpha, jnp.float32)
    if positions is not None:
        alpha = alpha * jnp.minimum(positions / RAMP_POSITIONS, 1.0)[..., None]
    d, s = z_dest.astype(jnp.float32), z_src.astype(jnp.float32)
    d_norm, s_norm = _norm(d), _norm(s)
    scaled = s * (d_norm / jnp.maximum(s_norm, _EPS))  # ratio's f(z_src): z_src at |z_dest|
    if scheme == "none":
        out = d * (1 - alpha) + alpha * s
    elif scheme == "ratio":
        out = d * (1 - alpha) + alpha * scaled
    elif scheme == "nonconvex":
        out = d + alpha * scaled
    elif scheme == "renorm":
        convex = d * (1 - alpha) + alpha * scaled
        out = convex * (d_norm / jnp.maximum(_norm(convex), _EPS))
    elif scheme == "orthogonal":
        along = jnp.sum(scaled * d, -1, keepdims=True) / jnp.maximum(d_norm**2, _EPS)
        out = d + alpha * (scaled - along * d)
    elif scheme == "slerp":
        cos = jnp.clip(jnp.sum(d * s, -1, keepdims=True) / jnp.maximum(d_norm * s_norm, _EPS), -1.0, 1.0)
        theta = jnp.arccos(cos)
        sin = jnp.sin(theta)
        parallel = sin < 1e-6  # the directions agree: slerp is the identity direction, lerp is exact
        safe_sin = jnp.where(parallel, 1.0, sin)
        keep = jnp.where(parallel, 1 - alpha, jnp.sin((1 - alpha) * theta) / safe_sin)
        toward = jnp.where(parallel, alpha, jnp.sin(alpha * theta) / safe_sin)
        out = d * keep + toward * scaled
    else:
        raise ValueError(f"recirculation scheme must be one of {SCHEMES}, got {scheme!r}")
    return out.astype(z_dest.dtype)


def adaptive_specs(hidden_size: int, width: int) -> dict:
    """The adaptive MLP [z_src; z_dest] (2D) -> width -> width -> (alpha, beta) (2D); its last layer starts
    at zero with biases logit(0.1) | logit(0.9), so every token starts at ADAPTIVE_INIT."""
    d, w = hidden_size, width
    logit = lambda p: math.log(p / (1 - p))
    bias = lambda k, shape, dtype: jnp.concatenate([jnp.full((d,), logit(a), dtype) for a in ADAPTIVE_INIT])
    layer = lambda n_in, n_out, init: {
        "kernel": ParamSpec((n_in, n_out), (None, None), init, "matrix", 1),
        "bias": ParamSpec((n_out,), (None,), zeros, "bias"),
    }
    out = layer(w, 2 * d, zeros)
    out["bias"] = ParamSpec((2 * d,), (None,), bias, "bias")
    return {"fc1": layer(2 * d, w, normal(0.02)), "fc2": layer(w, w, normal(0.02)), "out": out}


def adaptive_mix(
    mlp: dict,
    z_dest: Float[Array, "B T D"],
    z_src: Float[Array, "B T D"],
    *,
    positions: Int[Array, "B T"] | None = None,
) -> Float[Array, "B T D"]:
    """alpha f(z_src) + beta z_dest with per-channel alpha, beta from the MLP (ratio's f, optional ramp)."""
    d, s = z_dest.astype(jnp.float32), z_src.astype(jnp.float32)
    rms = lambda z: z * jax.lax.rsqrt(jnp.mean(z * z, -1, keepdims=True) + 1e-6)
    x = jnp.concatenate([rms(s), rms(d)], axis=-1)
    for name in ("fc1", "fc2"):
        x = jax.nn.gelu(x @ mlp[name]["kernel"].astype(jnp.float32) + mlp[name]["bias"].astype(jnp.float32))
    gates = jax.nn.sigmoid(
        x @ mlp["out"]["kernel"].astype(jnp.float32) + mlp["out"]["bias"].astype(jnp.float32)
    )
    alpha, beta = jnp.split(gates, 2, axis=-1)
    if positions is not None:
        alpha = alpha * jnp.minimum(positions / RAMP_POSITIONS, 1.0)[..., None]
    scaled = s * (_norm(d) / jnp.maximum(_norm(s), _EPS))
    return (alpha * scaled + beta * d).astype(z_dest.dtype)


def _norm(z: Float[Array, "B T D"]) -> Float[Array, "B T 1"]:
    return jnp.sqrt(jnp.sum(z * z, -1, keepdims=True))
