"""Weights a loop reuses, gathered once before it.

Under ZeRO-3 (`fsdp`) a weight is stored split over the data-parallel devices and all-gathered where a
layer uses it. Inside a loop that reruns layers (T²MLR's Jacobi passes, the LRT's and PonderLM-2's
refinement passes, a looped model's repeats) XLA gathers it again at every trip: it does not hoist a
collective out of a while loop. `gather_once` gathers the weights before the loop (split over the
model-parallel axes only), and sends their gradient back split over every data-parallel axis, so that a
differentiated loop reduce-scatters its weight gradients (as the layers' own scan does; under ZeRO-1 into
the optimizer state's shards) instead of all-reducing whole copies. The price is the gathered copies'
memory (the weights whole in the compute dtype, split still over `tensor` and `expert`).
"""

from __future__ import annotations

import functools

import jax
from jax.sharding import PartitionSpec

from t2mlr_jax.parallel.rules import WEIGHT_DATA_AXES, is_axes, weight_partition_spec


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _gather(x: jax.Array, gathered: PartitionSpec, reduced: PartitionSpec) -> jax.Array:
    return jax.lax.with_sharding_constraint(x, gathered)


def _gather_fwd(x, gathered, reduced):
    return _gather(x, gathered, reduced), None


def _gather_bwd(gathered, reduced, _, g):
    return (jax.lax.with_sharding_constraint(g, reduced),)


_gather.defvjp(_gather_fwd, _gather_bwd)


def gather_once(params, axes):
    """`params` (a pytree of arrays) gathered over the data-parallel axes by their logical `axes` (a
    matching tree of axis-name tuples), where a mesh is set (`jax.set_mesh`); unchanged otherwise."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return params

    def gather(names, x):
        gathered = weight_partition_spec(names, x.shape, mesh, split_over=())
        return _gather(x, gathered, weight_partition_spec(names, x.shape, mesh, split_over=WEIGHT_DATA_AXES))

    return jax.tree.map(gather, axes, params, is_leaf=is_axes)
