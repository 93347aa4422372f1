"""The one table mapping logical axis names (used by params.ParamSpec.axes and by `constrain`) to mesh axes.

Mesh axes: `data` (pure data parallel), `fsdp` (data parallel with parameters sharded over it, ZeRO-3
style), `expert` (expert parallel: a mixture of experts' experts are split over it; the batch is too, so
the expert devices are data parallel everywhere else) and `tensor` (Megatron-style model parallel: heads
and MLP columns). A logical axis whose size a mesh axis does not divide (e.g. SmolLM2-135M's 3 kv heads on
tensor=2) falls back to replicated on that dimension, so every preset runs on every mesh.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "expert", "tensor")
RESIDUAL_AXES = ("batch", "length", "act_embed")  # the residual stream [B, T, D] between blocks

LOGICAL_AXIS_RULES: dict[str, tuple[str, ...]] = {
    # activations
    "batch": ("data", "fsdp", "expert"),
    "length": (),
    "act_embed": (),
    "act_heads": ("tensor",),
    "act_kv_heads": ("tensor",),
    "act_mlp": ("tensor",),
    "act_vocab": ("tensor",),
    # parameters
    "layers": (),
    "embed": ("fsdp",),
    # nanochat's value embeddings' head width: fsdp shards these vocabulary-sized tables as it shards
    # embed_tokens' width (a name of its own: Muon reads d_model off the `embed` axes)
    "value_embed": ("fsdp",),
    "vocab": ("tensor",),
    "heads": ("tensor",),
    "kv_heads": ("tensor",),
    "head_dim": (),
    "mlp": ("tensor",),
    "experts": ("expert",),
    "moe_groups": ("data", "fsdp"),  # a MoE's per-row dispatch buffers (the expert axis holds experts)
    "norm": (),
    "mixer_in": ("fsdp",),
    "mixer_out": ("tensor",),
}


def partition_spec(
    axes: Sequence[str | None], shape: Sequence[int], mesh: Mesh | AbstractMesh
) -> PartitionSpec:
    """PartitionSpec for an array with these logical axes; mesh axes that do not divide are dropped."""
    if len(axes) != len(shape):
        raise ValueError(f"logical axes {tuple(axes)} do not match an array of rank {len(shape)}")
    used: set[str] = set()
    spec = []
    for name, size in zip(axes, shape):
        if name is not None and name not in LOGICAL_AXIS_RULES:
            raise ValueError(f"logical axis {name!r} has no rule in LOGICAL_AXIS_RULES")
        chosen, prod = [], 1
        for mesh_axis in LOGICAL_AXIS_RULES.get(name, ()) if name else ():
            n = mesh.shape[mesh_axis]
            if mesh_axis in used or n == 1 or size % (prod * n):
                continue
            chosen.append(mesh_axis)
            prod *= n
        used.update(chosen)
        spec.append(tuple(chosen) if len(chosen) > 1 else (chosen[0] if chosen else None))
    return PartitionSpec(*spec)


def named_sharding(axes: Sequence[str | None], shape: Sequence[int], mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, partition_spec(axes, shape, mesh))


def is_axes(x) -> bool:
    """A leaf of a logical-axes tree: a tuple of axis names (or None)."""
    return isinstance(x, tuple) and all(a is None or isinstance(a, str) for a in x)


def tree_shardings(axes_tree, shapes_tree, mesh: Mesh):
    """NamedShardings for a pytree, given a matching tree of logical-axes tuples and of shapes/arrays."""
    return jax.tree.map(
        lambda a, s: named_sharding(a, s.shape, mesh), axes_tree, shapes_tree, is_leaf=is_axes
    )


def constrain(x: jax.Array, axes: Sequence[str | None]) -> jax.Array:
    """Pin an activation's sharding inside jit when a mesh is set (`jax.set_mesh`); a no-op otherwise."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    return jax.lax.with_sharding_constraint(x, partition_spec(axes, x.shape, mesh))
