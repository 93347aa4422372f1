"""Weights a loop reuses, gathered once before it.

Under ZeRO-3 (`fsdp`) a weight is stored sharded and all-gathered where a layer uses it. Inside a loop
that reruns layers (T²MLR's Jacobi passes, the LRT's and PonderLM-2's refinement passes, a looped
model's repeats) XLA gathers it again at every trip: it does not hoist a collective out of a while loop.
`gather_once` gathers the weights before the loop (their sharding without the storage-only axes), and
its gradient goes back to the stored sharding, so that a differentiated loop accumulates its weight
gradients reduce-scattered, as the layers' own scan does, instead of all-reducing whole copies. The
price is the gathered copies' memory (the weights whole in the compute dtype, sharded still over
`tensor` and `expert`).
"""

from __future__ import annotations

import functools

import jax
from jax.sharding import PartitionSpec

from t2mlr_jax.parallel.rules import is_axes, partition_spec

STORAGE_AXES = ("fsdp",)  # mesh axes weights are sharded over only to be stored, not to split compute


def _without_storage(spec: PartitionSpec) -> PartitionSpec:
    def keep(entry):
        axes = tuple(a for a in (entry if isinstance(entry, tuple) else (entry,)) if a not in STORAGE_AXES)
        return axes if len(axes) > 1 else (axes[0] if axes and axes[0] is not None else None)

    return PartitionSpec(*map(keep, spec))


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _gather(x: jax.Array, gathered: PartitionSpec, stored: PartitionSpec) -> jax.Array:
    return jax.lax.with_sharding_constraint(x, gathered)


def _gather_fwd(x, gathered, stored):
    return _gather(x, gathered, stored), None


def _gather_bwd(gathered, stored, _, g):
    return (jax.lax.with_sharding_constraint(g, stored),)


_gather.defvjp(_gather_fwd, _gather_bwd)


def gather_once(params, axes):
    """`params` (a pytree of arrays) gathered over the storage axes by their logical `axes` (a matching
    tree of axis-name tuples), where a mesh is set (`jax.set_mesh`); unchanged otherwise."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return params

    def gather(names, x):
        stored = partition_spec(names, x.shape, mesh)
        return _gather(x, _without_storage(stored), stored)

    return jax.tree.map(gather, axes, params, is_leaf=is_axes)
