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

Every scheme at alpha = 0 returns z_dest bit for bit: each is written as z_dest times a coefficient that
is exactly 1 there, plus a term multiplied by alpha (a zero-norm z_src cannot turn that term into NaN).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jaxtyping import Array, Float, Int

SCHEMES = ("none", "ratio", "nonconvex", "renorm", "orthogonal", "slerp")
CONVEX = ("none", "ratio", "renorm", "slerp")  # alpha is a mixing weight: it must lie in (0, 1]
RAMP_POSITIONS = 10
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
    alpha: float = 0.1
    scheme: str = "ratio"
    ramp: bool = False

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
        self, z_dest: Float[Array, "B T D"], z_src: Float[Array, "B T D"], positions: Int[Array, "B T"]
    ) -> Float[Array, "B T D"]:
        return mix(z_dest, z_src, self.alpha, scheme=self.scheme, positions=positions if self.ramp else None)


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


def _norm(z: Float[Array, "B T D"]) -> Float[Array, "B T 1"]:
    return jnp.sqrt(jnp.sum(z * z, -1, keepdims=True))
