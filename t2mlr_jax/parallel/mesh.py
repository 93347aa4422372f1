"""Building the (data, fsdp, expert, tensor) mesh from config sizes or a mesh string ("data:16,fsdp:16"),
and the divisibility checks that must fail before anything compiles."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh

from t2mlr_jax.parallel.rules import LOGICAL_AXIS_RULES, MESH_AXES


def resolve_mesh_shape(
    data: int = -1, fsdp: int = 1, tensor: int = 1, num_devices: int | None = None, *, expert: int = 1
) -> tuple[int, int, int, int]:
    """Sizes of the mesh axes in MESH_AXES order (data, fsdp, expert, tensor); at most one may be -1,
    meaning 'all remaining devices'. `expert` is keyword-only so (data, fsdp, tensor) calls keep working."""
    n = jax.device_count() if num_devices is None else num_devices
    given = {"data": data, "fsdp": fsdp, "expert": expert, "tensor": tensor}
    sizes = [int(given[name]) for name in MESH_AXES]
    if sizes.count(-1) > 1:
        raise ValueError(
            f"mesh: at most one of {'/'.join(MESH_AXES)} may be -1, got {dict(zip(MESH_AXES, sizes))}"
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
        raise ValueError(f"mesh: {'*'.join(MESH_AXES)} = {int(np.prod(sizes))} but there are {n} devices")
    return tuple(sizes)


def parse_mesh(text: str) -> dict[str, int]:
    """'data:16,fsdp:16' -> {"data": 16, "fsdp": 16}; the other mesh axes are 1 (one may be -1: the rest)."""
    sizes = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, size = part.partition(":")
        if name not in MESH_AXES or not size.lstrip("-").isdigit():
            raise ValueError(f"--mesh={text!r}: {part!r} is not <axis>:<size> with axis one of {MESH_AXES}")
        sizes[name] = int(size)
    return {axis: sizes.get(axis, 1) for axis in MESH_AXES}


def make_mesh(
    data: int = -1, fsdp: int = 1, tensor: int = 1, devices: Sequence | None = None, *, expert: int = 1
) -> Mesh:
    devices = list(jax.devices() if devices is None else devices)
    shape = resolve_mesh_shape(data, fsdp, tensor, len(devices), expert=expert)
    # On a TPU torus each mesh axis takes whole physical axes where it can, and splits one where it must
    # (expert:8 on a 16x16 v5e, fsdp:8 on a 4x4x4 v5p), as MaxText allows; elsewhere devices go in order.
    grid = mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
    return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))


def check_batch(global_batch: int, mesh: Mesh, grad_accum: int = 1) -> None:
    """The global batch (each micro-batch of it) must split evenly over the data-parallel devices (the
    batch axes: data, fsdp and expert, which is data parallel outside the experts)."""
    batch_axes = LOGICAL_AXIS_RULES["batch"]
    parallel = int(np.prod([mesh.shape[a] for a in batch_axes]))
    if global_batch % grad_accum:
        raise ValueError(f"batch_size {global_batch} is not divisible by grad_accum {grad_accum}")
    if (global_batch // grad_accum) % parallel:
        raise ValueError(
            f"batch_size {global_batch} (per micro-batch {global_batch // grad_accum}) is not "
            f"divisible by the data-parallel devices {'*'.join(batch_axes)} = {parallel}"
        )
    if global_batch % jax.process_count():
        raise ValueError(f"batch_size {global_batch} is not divisible by the {jax.process_count()} hosts")


def check_experts(num_experts: int, mesh: Mesh) -> None:
    """A mixture of experts' experts must split evenly over the mesh's expert axis (else they would
    silently be replicated: no expert parallelism)."""
    n = mesh.shape.get("expert", 1)
    if n > 1 and num_experts % n:
        raise ValueError(
            f"model.moe_experts ({num_experts}) is not divisible by the expert-parallel devices "
            f"mesh.expert = {n}: choose mesh.expert dividing the number of experts"
        )


def target_platform() -> str:
    """The platform the program being traced is compiled for: that of the mesh's devices when one is set
    (`jax.set_mesh`; a TPU topology's when compiling ahead of time from a CPU host), else the default
    backend. Kernel choices read this, not `jax.default_backend()`, which is only the host's."""
    mesh = jax.sharding.get_abstract_mesh()
    device = None if mesh.empty else mesh.abstract_device
    return jax.default_backend() if device is None else device.platform
