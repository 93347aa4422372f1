"""The one table mapping logical axis names (used by params.ParamSpec.axes and by `constrain`) to mesh axes.

Mesh axes: `data` (pure data parallel), `fsdp` (data parallel with parameters sharded over it, ZeRO-3
style; under ZeRO-1 only their optimizer state, as over `data`), `expert` (expert parallel: a mixture of
experts' experts are split over it; the batch is too, so the expert devices are data parallel everywhere
else) and `tensor` (Megatron-style model parallel: heads and MLP columns). A logical axis whose size a
mesh axis does not divide (e.g. SmolLM2-135M's 3 kv heads on tensor=2) falls back to replicated on that
dimension, so every preset runs on every mesh.

Parameters (and their optimizer state) are placed by `weight_partition_spec`: the model-parallel axes as
the table gives them, and the data-parallel axes that a ZeRO stage (`ZERO_STAGES`, `mesh.zero`) splits
weights over on the weight's fsdp dimension (embed), or, where the axis does not divide it (the
parameter-matched baseline's 584 on fsdp:16), on another of its dimensions that it does divide
(`FSDP_FALLBACK`): every large weight is split whenever any of its dimensions allows. Activations
(`constrain`) keep the table alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

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

# Where a data-parallel axis goes in a weight whose fsdp dimension (embed, value_embed, mixer_in) it does
# not divide: the first of these dimensions it divides, beside the dimension's own tensor axis (never
# `layers`: a scan gathers one layer at a time; never `experts`: the expert axis holds them).
FSDP_FALLBACK = ("mlp", "vocab", "heads", "kv_heads", "head_dim", "mixer_out")
# The data-parallel axes a ZeRO stage may split weights or their optimizer state over.
WEIGHT_DATA_AXES = ("data", "fsdp")


class ZeroStage(NamedTuple):
    """The data-parallel mesh axes a ZeRO stage splits the weights over (their gradients follow), and those
    it splits the optimizer state over (where each parameter's update is computed)."""

    weights: tuple[str, ...]
    optimizer_state: tuple[str, ...]


ZERO_STAGES = {
    # ZeRO-1: each chip holds the whole weights; gradients are reduce-scattered to the optimizer state's
    # shards, updated there, and the new weights all-gathered.
    1: ZeroStage(weights=(), optimizer_state=WEIGHT_DATA_AXES),
    # ZeRO-3 (FSDP): weights over fsdp, gathered a layer at a time; replicated over data.
    3: ZeroStage(weights=("fsdp",), optimizer_state=("fsdp",)),
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
        spec.append(chosen)
    return _spec(spec)


def weight_partition_spec(
    axes: Sequence[str | None],
    shape: Sequence[int],
    mesh: Mesh | AbstractMesh,
    split_over: Sequence[str] = ZERO_STAGES[3].weights,
) -> PartitionSpec:
    """PartitionSpec for a parameter (or its optimizer state): the model-parallel axes as `partition_spec`
    places them, and each data-parallel mesh axis of `split_over` on the first dimension it divides, among
    the weight's fsdp dimensions (those the table maps to fsdp) and then FSDP_FALLBACK's. A weight without
    an fsdp dimension (norms, biases, gates: small) is never split over them."""
    spec = [
        [a for a in _mesh_axes(entry) if a not in WEIGHT_DATA_AXES]
        for entry in partition_spec(axes, shape, mesh)
    ]
    home = [i for i, name in enumerate(axes) if "fsdp" in LOGICAL_AXIS_RULES.get(name, ())]
    fallback = [i for name in FSDP_FALLBACK for i, own in enumerate(axes) if home and own == name]
    for mesh_axis in split_over:
        n = mesh.shape[mesh_axis]
        fits = [i for i in home + fallback if shape[i] % (n * math.prod(mesh.shape[a] for a in spec[i])) == 0]
        if n > 1 and fits:
            spec[fits[0]].append(mesh_axis)
    return _spec(spec)


def _spec(dims: list[list[str]]) -> PartitionSpec:
    """A PartitionSpec from each dimension's mesh axes (none: None; one: its name; several: a tuple)."""
    return PartitionSpec(*(tuple(dim) if len(dim) > 1 else (dim[0] if dim else None) for dim in dims))


def _mesh_axes(entry) -> tuple[str, ...]:
    """The mesh axes of one PartitionSpec entry (None, a name, or a tuple of names)."""
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def named_sharding(axes: Sequence[str | None], shape: Sequence[int], mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, partition_spec(axes, shape, mesh))


def is_axes(x) -> bool:
    """A leaf of a logical-axes tree: a tuple of axis names (or None)."""
    return isinstance(x, tuple) and all(a is None or isinstance(a, str) for a in x)


def tree_shardings(axes_tree, shapes_tree, mesh: Mesh, split_over: Sequence[str] = ZERO_STAGES[3].weights):
    """NamedShardings of weights (`weight_partition_spec`, data-parallel axes `split_over`), given a matching
    tree of logical-axes tuples and of shapes/arrays."""
    return jax.tree.map(
        lambda a, s: NamedSharding(mesh, weight_partition_spec(a, s.shape, mesh, split_over)),
        axes_tree,
        shapes_tree,
        is_leaf=is_axes,
    )


def constrain(x: jax.Array, axes: Sequence[str | None]) -> jax.Array:
    """Pin an activation's sharding inside jit when a mesh is set (`jax.set_mesh`); a no-op otherwise."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    return jax.lax.with_sharding_constraint(x, partition_spec(axes, x.shape, mesh))
