"""`ParamSpec`: what the parameter table says about one parameter, and the functions read off a table.

A table is a nested dict of ParamSpecs shaped like the params. Everything that needs to know about a
parameter reads its spec: init draws it, placement shards it by its logical `axes`, the optimizer masks
weight decay (and, for Muon, orthogonalises) by its `kind` and fan-in / fan-out dimensions and never
moves it when `frozen`, and interop flattens it to a PyTorch [out, in] weight by the same dimensions. A
parameter without a spec is an error everywhere, never silently replicated or decayed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

Init = Callable[[jax.Array, tuple, Any], jax.Array]

# matrix: a projection (decayed; Muon's domain). embedding / head: the vocabulary tables. norm: norm scales.
# bias: additive biases. gate: ReZero gammas that open the recurrent path. scalar: other learned
# coefficients (mixing weights, decay rates, LRT's γ). residual / skip: nanochat's per-layer λ_resid
# (Muon recipe: scalar LR x 0.01) and λ_x0 (Adam betas 0.96, 0.95). Weight decay skips norm, bias, gate
# (the T²MLR release's rule) and the nanochat scalars.
KINDS = ("matrix", "embedding", "head", "norm", "bias", "gate", "scalar", "residual", "skip")
NO_DECAY_KINDS = ("norm", "bias", "gate", "residual", "skip")
STACKED_AXES = ("layers", "experts")  # leading batch-like axes: one weight per layer / expert


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    shape: tuple[int, ...]
    axes: tuple[str | None, ...]  # logical axis names, one per dimension; None = replicated
    init: Init
    kind: str
    in_dims: int = 0  # matrices: how many dims after the stacked axes are fan-in (the rest are fan-out)
    dtype: str | None = None  # None = the model's param_dtype; "float32" pins (the gammas)
    # A pretrained weight the optimizer never updates (e.g. recirculation's adaptive variant trains only its
    # mixer MLP over a frozen base model).
    frozen: bool = False

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"ParamSpec kind must be one of {KINDS}, got {self.kind!r}")
        if len(self.axes) != len(self.shape):
            raise ValueError(f"ParamSpec axes {self.axes} do not match shape {self.shape}")

    @property
    def stacked(self) -> int:
        """How many leading dims are stacked copies (layers, experts) rather than one weight's dims."""
        n = 0
        while n < len(self.axes) and self.axes[n] in STACKED_AXES:
            n += 1
        return n

    @property
    def fan_in(self) -> tuple[int, ...]:
        return tuple(range(self.stacked, self.stacked + self.in_dims))

    @property
    def fan_out(self) -> tuple[int, ...]:
        return tuple(range(self.stacked + self.in_dims, len(self.shape)))

    @property
    def decays(self) -> bool:
        return self.kind not in NO_DECAY_KINDS


def normal(std: float) -> Init:
    return jax.nn.initializers.normal(stddev=std)


def uniform(std: float) -> Init:
    """U(-a, a) with standard deviation `std` (a = sqrt(3) std): nanochat's outlier-free matrix init."""
    bound = 3**0.5 * std
    return lambda key, shape, dtype: jax.random.uniform(key, shape, dtype, -bound, bound)


def constant(value: float) -> Init:
    return lambda key, shape, dtype: jnp.full(shape, value, dtype)


def ones(key, shape, dtype):
    return jnp.ones(shape, dtype)


def zeros(key, shape, dtype):
    return jnp.zeros(shape, dtype)


def is_spec(x) -> bool:
    return isinstance(x, ParamSpec)


def freeze(specs: dict) -> dict:
    """The same table with every parameter frozen (e.g. the base model under a trained mixer)."""
    return jax.tree.map(lambda s: dataclasses.replace(s, frozen=True), specs, is_leaf=is_spec)


def init_from_specs(specs: dict, key: jax.Array, param_dtype: str) -> dict:
    """Draw every parameter of a spec tree (the whole model, or a part such as the mixer)."""
    leaves, treedef = jax.tree.flatten(specs, is_leaf=is_spec)
    keys = jax.random.split(key, max(len(leaves), 1))
    return jax.tree.unflatten(
        treedef, [s.init(k, s.shape, jnp.dtype(s.dtype or param_dtype)) for s, k in zip(leaves, keys)]
    )


def spec_axes(specs: dict) -> dict:
    """The logical axis names of every parameter, as a pytree shaped like the params."""
    return jax.tree.map(lambda s: s.axes, specs, is_leaf=is_spec)


def spec_leaves(specs: dict) -> dict[tuple[str, ...], ParamSpec]:
    """{path: spec} with paths as tuples of names, e.g. ("layers", "self_attn", "q_proj")."""
    leaves = jax.tree_util.tree_flatten_with_path(specs, is_leaf=is_spec)[0]
    return {tuple(k.key for k in path): spec for path, spec in leaves}


def spec_shapes(specs: dict, param_dtype: str) -> dict:
    """The params a table describes, as ShapeDtypeStructs (no draws)."""
    return jax.tree.map(
        lambda s: jax.ShapeDtypeStruct(s.shape, jnp.dtype(s.dtype or param_dtype)), specs, is_leaf=is_spec
    )


def count_specs(specs: dict) -> int:
    """How many numbers the parameters of a table hold (nothing is drawn)."""
    return sum(math.prod(s.shape) for s in jax.tree.leaves(specs, is_leaf=is_spec))


def count_params(params) -> int:
    return sum(int(x.size) for x in jax.tree.leaves(params))


def matched_width(count_at: Callable[[int], int], target: int, start: int, multiple: int) -> int:
    """The narrowest width start + k * multiple (k >= 0) whose parameter count `count_at(width)` reaches
    `target`: how a baseline is widened to the parameter count of the model it is compared with."""
    width = start
    while count_at(width) < target:
        width += multiple
    return width
