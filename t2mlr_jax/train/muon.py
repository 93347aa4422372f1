"""Muon's orthogonalisation, stacked by shape: optax.contrib.scale_by_muon's update (its state, its Nesterov
momentum, its quintic Newton-Schulz with Frobenius preconditioning) with the Newton-Schulz iterations run
in a chosen dtype over every matrix of one (m, n) shape at once, as nanochat's MuonAdamW stacks them.

- bfloat16 (the default; nanochat's and Keller Jordan's reference Muon run their iterations in bf16): the
  iterate and the products are stored in bf16, every matmul accumulates in fp32 and each step's polynomial
  is combined in fp32 before it is rounded; fp32 is optax's update, to fp32 round-off.
- Stacking: a leaf's (batch, fan_in, fan_out) view (stacked layers and experts are batch axes) joins every
  other leaf of that shape in one batched iteration: one program per shape rather than one per matrix
  (what keeps an accelerator busy; on a CPU it is about even); the momentum stays per leaf, so the state,
  its sharding rules and checkpoints are optax's.
- A tall matrix (fan_in > fan_out) iterates as its transpose, as optax's does, and stacks with the wide
  matrices of the transposed shape (an MLP's up and down projections: one batch).
"""

from __future__ import annotations

import collections
import math
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, Float
from optax.contrib import MuonDimensionNumbers, MuonState

NS_COEFFICIENTS = (3.4445, -4.775, 2.0315)  # optax's (Keller Jordan's) quintic, every step alike
NS_DTYPES = ("bfloat16", "float32")
EPS = 1e-8  # optax's, added to the Frobenius norm


def _matmul(x: Array, y: Array, contract: tuple[int, int]) -> Float[Array, "b i j"]:
    """Batched x . y over the given axes (batch axis 0), accumulated in fp32 whatever the inputs' dtype."""
    return jax.lax.dot_general(
        x, y, ((contract[:1], contract[1:]), ((0,), (0,))), preferred_element_type=jnp.float32
    )


def newton_schulz(
    x: Float[Array, "b m n"], steps: int, coefficients: Float[Array, "*steps 3"], dtype: str = "bfloat16"
) -> Float[Array, "b m n"]:
    """`steps` quintic Newton-Schulz iterations X <- a X + (b G + c G^2) X, G = X X^T, of each x[i] / |x[i]|_F
    (a tall x is iterated as its transpose, as optax does); in fp32 the result of optax's
    orthogonalize_via_newton_schulz, in bf16 the iterate rounded after every step."""
    if x.shape[1] > x.shape[2]:
        return newton_schulz(x.mT, steps, coefficients, dtype).mT
    store = jnp.dtype(dtype)
    x = x / (jnp.sqrt(jnp.sum(jnp.square(x), axis=(1, 2), keepdims=True)) + EPS)
    x = x.astype(store)
    for i in range(steps):
        a, b, c = coefficients if coefficients.ndim == 1 else coefficients[i]
        gram = _matmul(x, x, (2, 2))  # symmetric: G^2 needs no transpose either
        poly = b * gram + c * _matmul(gram.astype(store), gram.astype(store), (2, 1))
        x = (a * x.astype(jnp.float32) + _matmul(poly.astype(store), x, (2, 1))).astype(store)
    return x


def _batched(x: Array, dims: MuonDimensionNumbers) -> tuple[Array, Any]:
    """x as a stack of wide matrices, (batch, fan_in, fan_out) or, where fan_in > fan_out, its transpose
    (batch, fan_out, fan_in), and the function that takes such an array back to x's layout."""
    reduction = tuple(a % x.ndim for a in _tuple(dims.reduction_axis))
    output = tuple(a % x.ndim for a in _tuple(dims.output_axis))
    batch = tuple(a for a in range(x.ndim) if a not in reduction + output)
    fan_in, fan_out = (math.prod(x.shape[a] for a in axes) for axes in (reduction, output))
    tall = fan_in > fan_out
    order = batch + (output + reduction if tall else reduction + output)
    flat = (math.prod(x.shape[a] for a in batch), *sorted((fan_in, fan_out)))
    unflat = tuple(x.shape[a] for a in order)
    inverse = tuple(sorted(range(x.ndim), key=lambda i: order[i]))
    return jnp.transpose(x, order).reshape(flat), lambda y: jnp.transpose(y.reshape(unflat), inverse)


def _tuple(axes) -> tuple[int, ...]:
    return tuple(axes) if isinstance(axes, (tuple, list)) else (axes,)


def orthogonalise(tree: Any, dims: Any, steps: int, coefficients: Array, dtype: str) -> Any:
    """Every matrix of `tree` (dims: its MuonDimensionNumbers, a MaskedNode where there is none)
    orthogonalised by `newton_schulz`, the matrices of one wide shape (`_batched`) in one batch."""
    leaves, treedef = jax.tree.flatten(tree, is_leaf=lambda x: isinstance(x, optax.transforms.MaskedNode))
    dim_leaves = treedef.flatten_up_to(dims)
    views = [
        None if isinstance(leaf, optax.transforms.MaskedNode) else _batched(leaf, d)
        for leaf, d in zip(leaves, dim_leaves)
    ]
    groups = collections.defaultdict(list)  # (fan_in, fan_out) -> indices of the leaves of that shape
    for i, view in enumerate(views):
        if view is not None:
            groups[view[0].shape[1:]].append(i)
    out = list(leaves)
    for members in groups.values():
        sizes = [views[i][0].shape[0] for i in members]
        stacked = jnp.concatenate([views[i][0] for i in members])
        # Laid out wide before the first product: XLA would otherwise fold a tall matrix's transpose into
        # that product's contracting dims, a form XLA:CPU's bf16 x bf16 -> fp32 dot does not run.
        done = newton_schulz(jax.lax.optimization_barrier(stacked), steps, coefficients, dtype)
        start = 0
        for i, n in zip(members, sizes):
            out[i] = views[i][1](done[start : start + n]).astype(leaves[i].dtype)
            start += n
    return jax.tree.unflatten(treedef, out)


def scale_by_muon(
    ns_steps: int = 5,
    beta: float | Array = 0.95,
    nesterov: bool = True,
    *,
    weight_dimension_numbers: Any,
    ns_dtype: str = "bfloat16",
) -> optax.GradientTransformation:
    """optax.contrib.scale_by_muon (its MuonState, momentum and defaults) with `orthogonalise`'s stacked
    Newton-Schulz in `ns_dtype`."""
    if ns_dtype not in NS_DTYPES:
        raise ValueError(f"optimizer.muon.ns_dtype must be one of {NS_DTYPES}, got {ns_dtype!r}")

    def init(params):
        mu = optax.tree.zeros_like(params)
        return MuonState(count=jnp.zeros([], jnp.int32), mu=mu, ns_coeffs=jnp.asarray(NS_COEFFICIENTS))

    def update(updates, state, params=None):
        del params
        mu = optax.tree.update_moment(updates, state.mu, beta, 1)
        count = optax.safe_increment(state.count)
        if nesterov:
            mu_hat = jax.tree.map(
                lambda m, g: beta * m + (1 - beta) * g,
                optax.tree.bias_correction(mu, beta, optax.safe_increment(count)),
                optax.tree.bias_correction(updates, beta, count),
            )
        else:
            mu_hat = optax.tree.bias_correction(mu, beta, count)
        updates = orthogonalise(mu_hat, weight_dimension_numbers, ns_steps, state.ns_coeffs, ns_dtype)
        return updates, MuonState(count=count, mu=mu, ns_coeffs=state.ns_coeffs)

    return optax.GradientTransformation(init, update)
