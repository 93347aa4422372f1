"""Building the (data, fsdp, tensor) mesh from config sizes, and the divisibility checks that must
fail before anything compiles."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

from t2mlr_jax.parallel.rules import MESH_AXES


def resolve_mesh_shape(
    data: int = -1, fsdp: int = 1, tensor: int = 1, num_devices: int | None = None
) -> tuple[int, int, int]:
    """Sizes of (data, fsdp, tensor); at most one may be -1, meaning 'all remaining devices'."""
    n = jax.device_count() if num_devices is None else num_devices
    sizes = [int(data), int(fsdp), int(tensor)]
    if sizes.count(-1) > 1:
        raise ValueError(
            f"mesh: at most one of data/fsdp/tensor may be -1, got {dict(zip(MESH_AXES, sizes))}"
        )
    for name, s in zip(MESH_AXES, sizes):
        if s == 0 or s < -1:
            raise ValueError(f"mesh.{name} must be >= 1 or -1, got {s}")
    known = int(np.prod([s for s in sizes if s != -1]))
    if -1 in sizes:
        if n % known:
            raise ValueError(
                f"mesh: {n} devices cannot be split with fixed sizes {dict(zip(MESH_AXES, sizes))}"
            )
        sizes[sizes.index(-1)] = n // known
    if int(np.prod(sizes)) != n:
        raise ValueError(f"mesh: data*fsdp*tensor = {int(np.prod(sizes))} but there are {n} devices")
    return tuple(sizes)


def make_mesh(data: int = -1, fsdp: int = 1, tensor: int = 1, devices: Sequence | None = None) -> Mesh:
    devices = list(jax.devices() if devices is None else devices)
    shape = resolve_mesh_shape(data, fsdp, tensor, len(devices))
    return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)


def check_batch(global_batch: int, mesh: Mesh, grad_accum: int = 1) -> None:
    """The global batch (each micro-batch of it) must split evenly over the data-parallel devices."""
    parallel = mesh.shape["data"] * mesh.shape["fsdp"]
    if global_batch % grad_accum:
        raise ValueError(f"batch_size {global_batch} is not divisible by grad_accum {grad_accum}")
    if (global_batch // grad_accum) % parallel:
        raise ValueError(
            f"batch_size {global_batch} (per micro-batch {global_batch // grad_accum}) is not "
            f"divisible by the data-parallel devices data*fsdp = {parallel}"
        )
    if global_batch % jax.process_count():
        raise ValueError(f"batch_size {global_batch} is not divisible by the {jax.process_count()} hosts")
