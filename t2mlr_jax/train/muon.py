"""Muon's orthogonalisation, stacked by shape: optax.contrib.scale_by_muon's update (its state, its Nesterov
momentum, its quintic Newton-Schulz with Frobenius preconditioning) with the Newton-Schulz iterations run
in a chosen dtype over every matrix of one (m, n) shape at once, as nanochat's MuonAdamW stacks them.

- bfloat16 (the default; nanochat's and Keller Jordan's reference Muon run their iterations in bf16): the
  iterate and the products are stored in bf16, every matmul accumulates in fp32 and each step's polynomial
  is combined in fp32 before it is rounded; fp32 is optax's update, to fp32 round-off.
- Stacking: a leaf's (batch, fan_in, fan_out) view (stacked layers and experts are batch axes) joins every
  other leaf of that shape in one batched iteration: one program per shape rather than one per matrix
  (what keeps an accelerator busy; a CPU takes the batch in cache-sized chunks, `_in_chunks`); the
  momentum stays per leaf, so the state, its sharding rules and checkpoints are optax's.
- A tall matrix (fan_in > fan_out) iterates as its transpose, as optax's does, and stacks with the wide
  matrices of the transposed shape (an MLP's up and down projections: one batch).

`scale_by_nanochat_muon` is nanochat's step instead (its MuonAdamW's, the LRT release's): Nesterov momentum
without bias correction, Polar Express's per-step coefficients on x / (|x|_F * 1.02 + 1e-6), then NorMuon's
variance reduction, through the same stacked iteration; its state holds NorMuon's factored second moment.
"""

from __future__ import annotations

import collections
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, Float
from optax.contrib import MuonDimensionNumbers, MuonState

from t2mlr_jax.parallel.mesh import target_platform

NS_COEFFICIENTS = (3.4445, -4.775, 2.0315)  # optax's (Keller Jordan's) quintic, every step alike
# Polar Express (Amsel, Persson, Musco & Gower 2025, arXiv:2505.16932): a quintic per step, optimised for 5
# steps at safety factor 2e-2 and cushion 2, the table nanochat iterates
POLAR_EXPRESS = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)
NS_DTYPES = ("bfloat16", "float32")
CPU_CHUNK_BYTES = 512 * 1024  # a chunk of the stack one batched product takes on a CPU (`_in_chunks`)
EPS = 1e-8  # optax's, added to the Frobenius norm
# nanochat's x / (|x|_F * 1.02 + 1e-6): the largest singular value 2% below 1 (the Frobenius norm bounds it)
POLAR_NORM_SCALE, POLAR_EPS = 1.02, 1e-6
NORMUON_FLOOR = 1e-10  # nanochat's floor of the second moment and of the rescaled norm


def _matmul(x: Array, y: Array, contract: tuple[int, int]) -> Float[Array, "b i j"]:
    """Batched x . y over the given axes (batch axis 0), accumulated in fp32 whatever the inputs' dtype."""
    return jax.lax.dot_general(
        x, y, ((contract[:1], contract[1:]), ((0,), (0,))), preferred_element_type=jnp.float32
    )


def newton_schulz(
    x: Float[Array, "b m n"],
    steps: int,
    coefficients: Float[Array, "*steps 3"],
    dtype: str = "bfloat16",
    norm_scale: float = 1.0,
    eps: float = EPS,
) -> Float[Array, "b m n"]:
    """`steps` quintic Newton-Schulz iterations X <- a X + (b G + c G^2) X, G = X X^T (one row of
    `coefficients` per step, or one for all), of each x[i] / (|x[i]|_F * norm_scale + eps) (a tall x is
    iterated as its transpose, as optax does); in fp32 with optax's coefficients, scale and eps the result of
    optax's orthogonalize_via_newton_schulz, in bf16 the iterate rounded after every step."""
    if x.shape[1] > x.shape[2]:
        return newton_schulz(x.mT, steps, coefficients, dtype, norm_scale, eps).mT
    store = jnp.dtype(dtype)
    x = x / (jnp.sqrt(jnp.sum(jnp.square(x), axis=(1, 2), keepdims=True)) * norm_scale + eps)
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
    reduction, output = _matrix_axes(x.ndim, dims)
    batch = tuple(a for a in range(x.ndim) if a not in reduction + output)
    fan_in, fan_out = (math.prod(x.shape[a] for a in axes) for axes in (reduction, output))
    tall = fan_in > fan_out
    order = batch + (output + reduction if tall else reduction + output)
    flat = (math.prod(x.shape[a] for a in batch), *sorted((fan_in, fan_out)))
    unflat = tuple(x.shape[a] for a in order)
    inverse = tuple(sorted(range(x.ndim), key=lambda i: order[i]))
    return jnp.transpose(x, order).reshape(flat), lambda y: jnp.transpose(y.reshape(unflat), inverse)


def _matrix_axes(ndim: int, dims: MuonDimensionNumbers) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the reduction (fan-in) axes, the output (fan-out) axes) of an array of rank `ndim`, non-negative."""
    return tuple(tuple(a % ndim for a in _tuple(axes)) for axes in (dims.reduction_axis, dims.output_axis))


def _tuple(axes) -> tuple[int, ...]:
    return tuple(axes) if isinstance(axes, (tuple, list)) else (axes,)


def orthogonalise(
    tree: Any,
    dims: Any,
    steps: int,
    coefficients: Array,
    dtype: str,
    norm_scale: float = 1.0,
    eps: float = EPS,
    normuon: tuple[float, Any] | None = None,
) -> Any:
    """Every matrix of `tree` (dims: its MuonDimensionNumbers, a MaskedNode where there is none)
    orthogonalised by `newton_schulz`, the matrices of one wide shape (`_batched`) in one batch. With
    `normuon` = (beta2, second moments shaped as `scale_by_nanochat_muon` keeps them), each result then goes
    through NorMuon (`_variance_reduced`) in the same batch: (updates, new second moments)."""
    leaves, treedef = jax.tree.flatten(tree, is_leaf=lambda x: isinstance(x, optax.transforms.MaskedNode))
    dim_leaves = treedef.flatten_up_to(dims)
    moments = treedef.flatten_up_to(normuon[1]) if normuon else [None] * len(leaves)
    views = [
        None
        if isinstance(leaf, optax.transforms.MaskedNode)
        else (_batched(leaf, d), _batched(nu, d) if normuon else (None, None))
        for leaf, d, nu in zip(leaves, dim_leaves, moments)
    ]
    groups = collections.defaultdict(list)  # (fan_in, fan_out) -> indices of the leaves of that shape
    for i, view in enumerate(views):
        if view is not None:
            groups[view[0][0].shape[1:]].append(i)

    def body(chunk):
        x, nu = chunk
        x = newton_schulz(x, steps, coefficients, dtype, norm_scale, eps)
        return _variance_reduced(x, nu, normuon[0]) if normuon else (x, nu)

    out, new_moments = list(leaves), list(moments)
    for members in groups.values():
        sizes = [views[i][0][0].shape[0] for i in members]
        stack = lambda k: jnp.concatenate([views[i][k][0] for i in members])
        done, nu = _in_chunks(body, (stack(0), stack(1) if normuon else None), dtype)
        start = 0
        for i, n in zip(members, sizes):
            (_, unview), (_, unview_nu) = views[i]
            out[i] = unview(done[start : start + n]).astype(leaves[i].dtype)
            if normuon:
                new_moments[i] = unview_nu(nu[start : start + n])
            start += n
    updates = jax.tree.unflatten(treedef, out)
    return (updates, jax.tree.unflatten(treedef, new_moments)) if normuon else updates


def _in_chunks(fn, stacked: tuple, dtype: str) -> tuple:
    """fn over the stacks (arrays of one leading batch, or None) at once, or, compiled for a CPU, over equal
    chunks of at most CPU_CHUNK_BYTES of matrices in turn (`lax.map`). XLA:CPU's batched dot (YNNPACK) slows
    down past a batch of that size: on a 2 MiB-L2 Xeon, 5 bf16 steps over 16 matrices of 256 x 256 take
    81 ms as one batch, 41 ms in 4 chunks of 4. The stack is laid out wide before the first product (the
    barrier): XLA would otherwise fold a tall matrix's transpose into that product's contracting dims, a
    form XLA:CPU's bf16 x bf16 -> fp32 dot does not run."""
    first = stacked[0]
    n, per_matrix = first.shape[0], math.prod(first.shape[1:]) * jnp.dtype(dtype).itemsize
    most = n if target_platform() != "cpu" else max(1, CPU_CHUNK_BYTES // per_matrix)
    size = max(d for d in range(1, min(n, most) + 1) if n % d == 0)  # equal chunks: one compiled body
    split = lambda x: x.reshape(n // size, size, *x.shape[1:])
    chunks = jax.lax.optimization_barrier(jax.tree.map(split, stacked))
    if size == n:
        return fn(jax.tree.map(lambda x: x[0], chunks))
    return jax.tree.map(lambda x: x.reshape(n, *x.shape[2:]), jax.lax.map(fn, chunks))


def _check_dtype(ns_dtype: str) -> None:
    if ns_dtype not in NS_DTYPES:
        raise ValueError(f"optimizer.muon.ns_dtype must be one of {NS_DTYPES}, got {ns_dtype!r}")


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
    _check_dtype(ns_dtype)

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


class NanochatMuonState(NamedTuple):
    """`scale_by_nanochat_muon`'s state: the momentum (params-shaped) and NorMuon's second moment, each
    matrix's shape with its shorter side (`_short_side`) at size 1."""

    mu: Any
    nu: Any


def _is_dims(x) -> bool:
    return isinstance(x, MuonDimensionNumbers)


def _short_side(shape: tuple[int, ...], dims: MuonDimensionNumbers) -> tuple[int, ...]:
    """The axes NorMuon averages over: the shorter side, fan-in on a tie (nanochat's torch (out, in) weight
    with out >= in keeps a second moment per row, per column otherwise); `_batched`'s axis 1."""
    reduction, output = _matrix_axes(len(shape), dims)
    fan_in, fan_out = (math.prod(shape[a] for a in axes) for axes in (reduction, output))
    return reduction if fan_out >= fan_in else output


def _variance_reduced(
    g: Float[Array, "b m n"], nu: Float[Array, "b 1 n"], beta2: float
) -> tuple[Float[Array, "b m n"], Float[Array, "b 1 n"]]:
    """NorMuon on orthogonalised updates in their wide view (`_batched`: m, the shorter side, is the one
    nanochat averages over): the mean square over m, averaged into `nu` by beta2, divides each column
    (rsqrt), then each matrix is rescaled to its own Frobenius norm; (updates in fp32, new nu)."""
    x = g.astype(jnp.float32)
    mean_square = jnp.mean(jnp.square(x), axis=1, keepdims=True)
    nu = beta2 * nu + (1 - beta2) * mean_square.astype(nu.dtype)
    scale = jax.lax.rsqrt(jnp.maximum(nu.astype(jnp.float32), NORMUON_FLOOR))
    # sums of squares before and after the scale: each column holds m entries of its mean square
    before = jnp.sum(mean_square * g.shape[1], axis=(1, 2), keepdims=True)
    after = jnp.sum(mean_square * g.shape[1] * jnp.square(scale), axis=(1, 2), keepdims=True)
    return x * (scale * (jnp.sqrt(before) / jnp.maximum(jnp.sqrt(after), NORMUON_FLOOR))), nu


def scale_by_nanochat_muon(
    ns_steps: int = 5,
    beta: float | Array = 0.95,
    beta2: float = 0.95,
    *,
    weight_dimension_numbers: Any,
    ns_dtype: str = "bfloat16",
) -> optax.GradientTransformation:
    """nanochat's Muon step (MuonAdamW's muon_step_fused) up to its parameter update: Nesterov momentum
    without bias correction (mu <- beta mu + (1 - beta) g, then beta mu + (1 - beta) g), `ns_steps` rows of
    Polar Express by `orthogonalise` in `ns_dtype` on x / (|x|_F * 1.02 + 1e-6), then NorMuon
    (`_variance_reduced`, second-moment decay beta2). Its cautious decay and shape-scaled lr are the
    optimizer's (train/optimizer.py)."""
    _check_dtype(ns_dtype)
    if not 1 <= ns_steps <= len(POLAR_EXPRESS):
        raise ValueError(
            f"Polar Express has coefficients for 1 to {len(POLAR_EXPRESS)} steps, not {ns_steps}"
        )
    dims = weight_dimension_numbers
    coefficients = POLAR_EXPRESS[:ns_steps]

    def init(params):
        mu = optax.tree.zeros_like(params)
        if jax.tree.structure(params) != jax.tree.structure(dims, is_leaf=_is_dims):
            # optax.tree_map_params (how the trainer shards optimizer state like the params) inits on one
            # placeholder for the whole params tree: the second moments then read as state of their own
            # (replicated: they are small), never given a param's sharding that their size-1 axes cannot take.
            return NanochatMuonState(mu, jax.tree.map(lambda d: jnp.zeros([]), dims, is_leaf=_is_dims))
        factored = lambda d, p: jnp.zeros(
            [1 if a in _short_side(p.shape, d) else n for a, n in enumerate(p.shape)], p.dtype
        )
        return NanochatMuonState(mu, jax.tree.map(factored, dims, params, is_leaf=_is_dims))

    def update(updates, state, params=None):
        del params
        mu = optax.tree.update_moment(updates, state.mu, beta, 1)
        nesterov = optax.tree.update_moment(updates, mu, beta, 1)
        updates, nu = orthogonalise(
            nesterov,
            dims,
            ns_steps,
            jnp.asarray(coefficients),
            ns_dtype,
            POLAR_NORM_SCALE,
            POLAR_EPS,
            normuon=(beta2, state.nu),
        )
        return updates, NanochatMuonState(mu, nu)

    return optax.GradientTransformation(init, update)
