"""The collectives of a compiled program, from its executed HLO instructions (t2mlr_jax/parallel/hlo.py).

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
"""

from __future__ import annotations

import dataclasses
import math
import re

from t2mlr_jax.parallel.hlo import Executed, Instruction, type_bytes

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
CHANNEL = re.compile(r"\bchannel_id=(\d+)")
REPLICA_GROUPS = re.compile(r"\breplica_groups=(\{\{[\d,]*\}|\[[\d,]+\]<=|mesh\[([^\]]*)\]\s*\{([^}]*)\})")


@dataclasses.dataclass(frozen=True)
class Collective:
    kind: str
    result_bytes: float
    group_size: int
    executions: int

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


def group_size(instruction: Instruction, num_devices: int) -> int:
    """Devices in each of a collective's groups: `{{0,1,..},..}`, iota `[groups,size]<=[..]` or
    `mesh[axis=size,..] {axes}`; none given: all devices."""
    groups = REPLICA_GROUPS.search(instruction.rest)
    if groups is None:
        return num_devices
    text = groups.group(1)
    if text.startswith("{{"):
        return len(text[2:-1].split(","))
    if text.startswith("["):
        return int(text[1:-3].split(",")[-1])
    sizes = dict(re.findall(r"'(\w+)'=(\d+)", groups.group(2)))
    return math.prod(int(sizes[a]) for a in re.findall(r"'(\w+)'", groups.group(3)))


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
        size = group_size(instruction, num_devices)
        found.setdefault(key, Collective(kind, type_bytes(result), size, run.executions))
    return list(found.values())


def summary(found: list[Collective]) -> dict[str, dict[str, int | float]]:
    """Per kind: distinct `ops`, executed `count`, result `bytes` and interconnect `traffic_bytes`."""
    table = {kind: {"ops": 0, "count": 0, "bytes": 0.0, "traffic_bytes": 0.0} for kind in KINDS}
    for c in found:
        row = table[c.kind]
        row["ops"] += 1
        row["count"] += c.executions
        row["bytes"] += c.result_bytes * c.executions
        row["traffic_bytes"] += c.traffic_bytes
    return table
