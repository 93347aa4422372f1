"""The two forms of a params dict's `layers`: stacked on a leading layer axis [L, ...] (one `lax.scan`
compiles every block once) or held per layer, a tuple of L trees (MaxText's `scan_layers=False`: the
blocks unroll, and each reads its weights where they lie instead of slicing them out of the stack and
writing their gradients back into it; ~5% off a CPU train step, at 3-4x the compile time).

`model.scan_layers` picks the form of the train state (`Architecture.specs` is then per layer too);
weights are always drawn stacked, so the form changes no number, and interop reads checkpoints stacked.
The same functions serve params, optimizer moments and ParamSpec tables.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from t2mlr_jax.model.spec import ParamSpec, is_spec


def map_layers(tree: Any, fn: Callable[[Any], Any]) -> Any:
    """`tree` with fn applied to the `layers` entry of its params dict (or of each dict in a tuple/list of
    them, e.g. recirculation's two stacks); anything else is returned as it is."""
    if isinstance(tree, dict):
        return {**tree, "layers": fn(tree["layers"])} if "layers" in tree else tree
    if isinstance(tree, tuple | list):
        return type(tree)(map_layers(item, fn) for item in tree)
    return tree


def _one_layer(x, i: int):
    if isinstance(x, ParamSpec):
        if x.axes[:1] != ("layers",):
            raise ValueError(f"a `layers` parameter without a leading layers axis: {x.axes}")
        return dataclasses.replace(x, shape=x.shape[1:], axes=x.axes[1:])
    return x[i]


def split(layers: Any) -> tuple:
    """A stacked `layers` tree as a tuple of per-layer trees (a tuple is returned as it is)."""
    if isinstance(layers, tuple | list):
        return tuple(layers)
    count = jax.tree.leaves(layers, is_leaf=is_spec)[0].shape[0]
    return tuple(jax.tree.map(lambda x: _one_layer(x, i), layers, is_leaf=is_spec) for i in range(count))


def _stack(*xs):
    if isinstance(xs[0], ParamSpec):
        return dataclasses.replace(xs[0], shape=(len(xs), *xs[0].shape), axes=("layers", *xs[0].axes))
    return (np if isinstance(xs[0], np.ndarray) else jnp).stack(xs)


def stack(layers: Any) -> Any:
    """Per-layer trees (a tuple, a list, or orbax's {"0": ..., "1": ...}) as one stacked tree."""
    if isinstance(layers, dict) and layers and all(k.isdigit() for k in layers):
        layers = [layers[str(i)] for i in range(len(layers))]
    if not isinstance(layers, tuple | list):
        return layers
    return jax.tree.map(_stack, *layers, is_leaf=is_spec)


def per_layer(tree: Any) -> Any:
    """`tree` (params, moments or a spec table) with its `layers` held per layer."""
    return map_layers(tree, split)


def stacked(tree: Any) -> Any:
    """`tree` with its `layers` stacked: the canonical form interop and fresh draws use."""
    return map_layers(tree, stack)


def is_per_layer(tree: Any) -> bool:
    """Whether a params dict (or spec table) holds its `layers` per layer."""
    return isinstance(tree, dict) and isinstance(tree.get("layers"), tuple)
