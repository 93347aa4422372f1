"""The collectives of a compiled program, from its executed HLO instructions (t2mlr_jax/parallel/hlo.py),
and the time each takes over the links it uses (t2mlr_jax/parallel/interconnect.py).

What is counted, per kind (all-gather, reduce-scatter, all-reduce, all-to-all, collective-permute):
- `ops`: the distinct collectives in the program text. A synchronous op counts once; an async pair counts
  once, at its `-done` (the `-start` is skipped). TPU's own async form copies one collective into several
  fusions (start, steps, done), all with the collective's `channel_id`: one channel_id inside one run of
  a loop body (or of the entry) is one collective.
- `count`: executions per program run: a collective inside a `while` body counts once per trip (hlo.py
  says how trip counts are read).
- `bytes`: the bytes of the op's result per device and execution, summed over executions (a tuple result:
  its elements summed). An all-gather's result is the gathered array, a reduce-scatter's the scattered
  shard, an all-reduce's the whole reduced array. TPU emits a reduce-scatter as a fusion named
  `all-reduce-scatter` around an all-reduce and a slice: it counts as a reduce-scatter of the slice.
- `traffic_bytes`: what one device sends over the interconnect for them, with ring algorithms over a
  group of n devices and result R: all-gather and all-to-all R (n-1)/n, reduce-scatter R (n-1) (its input
  is n R), all-reduce 2 R (n-1)/n (a reduce-scatter then an all-gather), collective-permute R.
- `seconds`: traffic over the links the op's groups use (interconnect.py), summed over executions.

Replica groups are read in every form the HLO prints: `{{0,1},{2,3}}`, iota `[G,S]<=[dims]T(perm)`, and
`mesh['a'=n,...]` (optionally `device_ids=(iota)`) `{'axes'}`; none given: all devices, one group.
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np

from t2mlr_jax.parallel.hlo import Executed, Instruction, type_bytes
from t2mlr_jax.parallel.interconnect import Interconnect, Route

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
CHANNEL = re.compile(r"\bchannel_id=(\d+)")
IOTA = r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?"
MESH = re.compile(r"mesh\[([^\]]*)\](?:,\s*device_ids=\(\[([\d,]+)\](?:T\(([\d,]+)\))?\))?\s*\{([^}]*)\}")
PAIRS = re.compile(r"\bsource_target_pairs=\{((?:\{\d+,\d+\},?)*)\}")
OP_NAME = re.compile(r'\bop_name="([^"]*)"')


def _ints(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", text)]


def _iota(dims: list[int], perm: str | None) -> np.ndarray:
    ids = np.arange(math.prod(dims)).reshape(dims)
    return ids.transpose(_ints(perm)) if perm else ids


def replica_groups(instruction: Instruction, num_devices: int) -> np.ndarray:
    """A collective's groups of devices (partition ids), [groups, size]; a collective-permute's
    source-target pairs, [pairs, 2]."""
    rest = instruction.rest
    if pairs := PAIRS.search(rest):
        return np.array(_ints(pairs.group(1)), dtype=int).reshape(-1, 2)
    at = rest.find("replica_groups=")
    text = rest[at + len("replica_groups=") :] if at >= 0 else "{}"
    if text.startswith("{{"):
        groups = re.match(r"\{((?:\{[\d,]*\},?)*)\}", text).group(1)
        return np.array([_ints(g) for g in re.findall(r"\{([\d,]*)\}", groups)], dtype=int)
    if iota := re.match(IOTA, text):
        shape, dims, perm = iota.groups()
        return _iota(_ints(dims), perm).reshape(_ints(shape))
    if mesh := MESH.match(text):
        axes = re.findall(r"'(\w+)'=(\d+)", mesh.group(1))
        names, sizes = [a for a, _ in axes], [int(n) for _, n in axes]
        ids = _iota(_ints(mesh.group(2)), mesh.group(3)) if mesh.group(2) else np.arange(math.prod(sizes))
        grouped = [names.index(a) for a in re.findall(r"'(\w+)'", mesh.group(4))]
        order = [i for i in range(len(names)) if i not in grouped] + grouped
        size = math.prod(sizes[i] for i in grouped)
        return ids.reshape(sizes).transpose(order).reshape(-1, size)
    return np.arange(num_devices)[None, :]


@dataclasses.dataclass(frozen=True)
class Collective:
    kind: str
    result_bytes: float
    groups: np.ndarray  # [groups, size] partition ids; a collective-permute: [pairs, 2]
    executions: int
    host: str  # the loops it runs in (hlo.Executed.host)
    op_name: str  # the jax operation it was lowered from, when the HLO names one

    @property
    def group_size(self) -> int:
        return 2 if self.kind == "collective-permute" else int(self.groups.shape[1])

    @property
    def in_loop(self) -> bool:
        return "/" in self.host

    @property
    def traffic_bytes(self) -> float:
        n, r = self.group_size, self.result_bytes
        share = {
            "all-gather": r * (n - 1) / n,
            "all-to-all": r * (n - 1) / n,
            "reduce-scatter": r * (n - 1),
            "all-reduce": 2 * r * (n - 1) / n,
            "collective-permute": r,
        }[self.kind]
        return share * self.executions

    def route(self, network: Interconnect) -> Route:
        members = self.groups.reshape(-1) if self.kind == "collective-permute" else self.groups[0]
        return network.route(self.kind, members)


def collectives(executed: list[Executed], num_devices: int) -> list[Collective]:
    """The program's distinct collectives (see the module docstring)."""
    found: dict[tuple, Collective] = {}
    for run in executed:
        instruction, computation = run.instruction, run.computation
        kind = instruction.opcode.removesuffix("-done")  # an async pair at its done; a start is no kind
        if kind not in KINDS:
            continue
        result = instruction.type
        if kind == "all-reduce" and computation.name.startswith("all-reduce-scatter"):
            kind, result = "reduce-scatter", computation.root.type
        channel = CHANNEL.search(instruction.rest)
        key = (channel.group(1), run.host) if channel else (computation.name, instruction.name, run.host)
        if key in found:
            continue
        # an async pair's groups and name are on its start
        start = (
            computation.instructions.get(instruction.operands[0])
            if instruction.opcode.endswith("-done")
            else None
        )
        source = start or instruction
        name = OP_NAME.search(source.rest)
        found[key] = Collective(
            kind,
            type_bytes(result),
            replica_groups(source, num_devices),
            run.executions,
            run.host,
            name.group(1) if name else "",
        )
    return list(found.values())


def each(found: list[Collective], network: Interconnect) -> list[dict]:
    """One record per distinct collective: its kind, executions, bytes per execution, group size, the torus
    axes and links its groups use, its traffic and time over all executions, its loop and its jax
    operation."""
    records = []
    for c in found:
        route = c.route(network)
        records.append(
            {
                "kind": c.kind,
                "count": c.executions,
                "bytes": c.result_bytes,
                "group_size": c.group_size,
                "axes": list(route.axes),
                "links": route.links,
                "hops": route.hops,
                "traffic_bytes": c.traffic_bytes,
                "seconds": network.seconds(c.traffic_bytes, route),
                "loop": c.host if c.in_loop else None,
                "op_name": c.op_name,
            }
        )
    return records


def summary(records: list[dict]) -> dict[str, dict[str, int | float]]:
    """Per kind: distinct `ops`, executed `count`, result `bytes`, interconnect `traffic_bytes` and the
    `seconds` they take over their links."""
    table = {
        kind: {"ops": 0, "count": 0, "bytes": 0.0, "traffic_bytes": 0.0, "seconds": 0.0} for kind in KINDS
    }
    for r in records:
        row = table[r["kind"]]
        row["ops"] += 1
        row["count"] += r["count"]
        row["bytes"] += r["bytes"] * r["count"]
        row["traffic_bytes"] += r["traffic_bytes"]
        row["seconds"] += r["seconds"]
    return table


def in_loops(records: list[dict]) -> list[dict]:
    """The collectives that run inside loops, per (loop, kind): distinct ops, executions (ops x trips),
    bytes, seconds and the jax operations they come from: what a loop re-sends on every trip."""
    table: dict[tuple[str, str], dict] = {}
    for r in records:
        if r["loop"] is None:
            continue
        row = table.setdefault(
            (r["loop"], r["kind"]),
            {
                "loop": r["loop"],
                "kind": r["kind"],
                "ops": 0,
                "count": 0,
                "bytes": 0.0,
                "seconds": 0.0,
                "op_names": [],
            },
        )
        row["ops"] += 1
        row["count"] += r["count"]
        row["bytes"] += r["bytes"] * r["count"]
        row["seconds"] += r["seconds"]
        if r["op_name"] and r["op_name"] not in row["op_names"]:
            row["op_names"].append(r["op_name"])
    return list(table.values())
