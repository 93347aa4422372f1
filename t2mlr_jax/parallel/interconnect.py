"""Which links a collective uses, and how long its bytes take over them.

A TPU slice is a 2-D or 3-D torus of chips (each chip's `coords`); every chip has one link to each
neighbour along each axis, each link carrying `Chip.link_bytes_per_s` each way. A collective over a group
of devices runs a ring along each torus axis its group spans (the axes along which the group's
coordinates vary):
- a ring closed by a wraparound link (the group covers the whole axis and the slice wraps it) sends each
  way at once: 2 links per axis; an open line: 1 (its end device receives everything through one link);
- members spaced s chips apart along an axis (an axis of the mesh split over a longer torus axis) share
  each link with s - 1 other rings: `hops` = s;
- an all-to-all's bytes each travel the mean torus distance between group members (`hops`);
- a collective-permute sends one way, each byte over the longest source-target distance (`hops`).
The time of a collective is then its per-device traffic x hops / (links x link bandwidth). A switched
interconnect (NVLink, or devices without coordinates) is one link each way at half the chip's
bidirectional figure, one hop.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

import numpy as np

from t2mlr_jax.parallel.chips import Chip


@dataclasses.dataclass(frozen=True)
class Route:
    axes: tuple[int, ...]  # torus axes the group spans (() on a switch)
    links: int  # link directions each device sends on at once
    hops: float  # link traversals per byte sent


@dataclasses.dataclass(frozen=True)
class Interconnect:
    """The devices of a program, in its partition-id order, on their chips' network."""

    link_bytes_per_s: float  # one direction of one link
    coords: np.ndarray | None = None  # [devices, axes]; None: a switch
    extents: tuple[int, ...] = ()
    wrap: tuple[bool, ...] = ()

    @classmethod
    def of(cls, chip: Chip, coords: Sequence[Sequence[int]] | None) -> Interconnect:
        """The network of devices at `coords` (None or a chip without ICI ports: a switch)."""
        if coords is None or chip.ici_ports is None:
            return cls(chip.link_bytes_per_s)
        points = np.asarray(coords, dtype=int)
        extents = tuple(int(e) for e in points.max(0) - points.min(0) + 1)
        return cls(chip.link_bytes_per_s, points - points.min(0), extents, chip.wraps(extents))

    def _distance(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        gap = np.abs(a - b)
        extents = np.asarray(self.extents)
        return np.where(np.asarray(self.wrap), np.minimum(gap, extents - gap), gap).sum(-1)

    def route(self, kind: str, group: Sequence[int] | np.ndarray) -> Route:
        """How a device of `group` (partition ids; a collective-permute: its flattened source-target
        pairs) reaches the others."""
        if self.coords is None:
            return Route((), 1, 1.0)
        points = self.coords[np.asarray(group)]
        if kind == "collective-permute":
            pairs = points.reshape(-1, 2, points.shape[-1])
            hops = float(self._distance(pairs[:, 0], pairs[:, 1]).max()) if len(pairs) else 0.0
            return Route(tuple(int(a) for a in np.flatnonzero(np.ptp(pairs, axis=1).any(0))), 1, hops)
        axes = tuple(int(a) for a in np.flatnonzero(np.ptp(points, axis=0)))
        links, stride = 0, 1
        for axis in axes:
            positions = np.unique(points[:, axis])
            whole = len(positions) == self.extents[axis]
            links += 2 if whole and self.wrap[axis] else 1
            stride = max(stride, int(np.diff(positions).min()))
        if kind == "all-to-all" and len(points) > 1:
            pairs = np.array(list(itertools.permutations(range(len(points)), 2)))
            return Route(
                axes, max(links, 1), float(self._distance(points[pairs[:, 0]], points[pairs[:, 1]]).mean())
            )
        return Route(axes, max(links, 1), float(stride))

    def seconds(self, traffic_bytes: float, route: Route) -> float:
        return traffic_bytes * route.hops / (route.links * self.link_bytes_per_s)
