"""The collectives of a compiled program, read off its optimised HLO text (`compiled.as_text()`).

What is counted, per kind (all-gather, reduce-scatter, all-reduce, all-to-all, collective-permute):
- `ops`: the distinct collectives in the program text. A synchronous op counts once; an async pair counts
  once, at its `-done` (the `-start` is skipped). TPU's own async form copies one collective into several
  fusions (start, steps, done), all with the collective's `channel_id`: one channel_id inside one run of
  a loop body (or of the entry) is one collective.
- `count`: executions per program run: a collective inside a `while` body counts once per trip. The trip
  count is XLA's `known_trip_count` annotation where the text has one (GPU), else read off the loop
  itself: a condition `counter < N` (or <=) on a tuple element whose initial value is a constant (TPU
  keeps no annotation in its text). A loop whose count cannot be read counts once (its trip count:
  None). Both branches of a conditional count, an upper bound.
- `bytes`: the bytes of the op's result per device and execution, summed over executions (a tuple result:
  its elements summed). An all-gather's result is the gathered array, a reduce-scatter's the scattered
  shard, an all-reduce's the whole reduced array. TPU emits a reduce-scatter as a fusion named
  `all-reduce-scatter` around an all-reduce and a slice: it counts as a reduce-scatter of the slice.
- `traffic_bytes`: what one device sends over the interconnect for them, with ring algorithms over a
  group of n devices and result R: all-gather and all-to-all R (n-1)/n, reduce-scatter R (n-1) (its input
  is n R), all-reduce 2 R (n-1)/n (a reduce-scatter then an all-gather), collective-permute R.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")

COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s+\(.*->.*\{\s*$")
# `  [ROOT] %name = <type> opcode(operands), attributes`: the type may be a tuple, so the opcode is the
# first word after whitespace that opens a parenthesis.
INSTRUCTION = re.compile(r"^\s+(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.+?)\s+([a-z][\w\-]*)\((.*)$")
ARRAY = re.compile(r"\b([a-z]\w*)\[([\d,]*)\]")
CALLEE = re.compile(r"\b(calls|to_apply|body|condition|true_computation|false_computation)=%?([\w.\-]+)")
BRANCHES = re.compile(r"\bbranch_computations=\{([^}]*)\}")
CHANNEL = re.compile(r"\bchannel_id=(\d+)")
TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
REPLICA_GROUPS = re.compile(r"\breplica_groups=(\{\{[\d,]*\}|\[[\d,]+\]<=|mesh\[([^\]]*)\]\s*\{([^}]*)\})")


@dataclasses.dataclass(frozen=True)
class Instruction:
    name: str
    type: str
    opcode: str
    rest: str  # operands and attributes

    @property
    def operands(self) -> list[str]:
        """Operand names (a typed operand, `f32[] %x`, by its name)."""
        inner = re.sub(r"/\*.*?\*/", "", self.rest.split(")", 1)[0])
        return [o.split()[-1].lstrip("%") for o in inner.split(",") if o.strip()]


@dataclasses.dataclass(frozen=True)
class Computation:
    name: str
    instructions: dict[str, Instruction]
    root: Instruction


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


def type_bytes(hlo_type: str) -> float:
    """Bytes of an HLO type (a tuple: its arrays summed): elements times the bits in the dtype's name
    (bf16: 16, f8e4m3fn: 8, c64: 64), pred one byte; layouts ({1,0:T(8,128)}) are ignored."""
    total = 0.0
    for dtype, dims in ARRAY.findall(hlo_type):
        digits = re.search(r"\d+", dtype)
        bits = 8 if dtype == "pred" else int(digits.group()) if digits else 0
        total += math.prod(int(d) for d in dims.split(",") if d) * bits / 8
    return total


def parse(hlo_text: str) -> tuple[dict[str, Computation], str]:
    """The computations of an HLO module by name, and the entry's name."""
    computations, entry, current, root = {}, None, None, None
    for line in hlo_text.splitlines():
        if current is None:
            header = COMPUTATION.match(line)
            if header:
                current, root = (header.group(1), {}), None
                entry = header.group(1) if line.startswith("ENTRY") else entry
        elif line.startswith("}"):
            computations[current[0]] = Computation(current[0], current[1], root)
            current = None
        elif match := INSTRUCTION.match(line):
            instruction = Instruction(match.group(2), match.group(3), match.group(4), match.group(5))
            current[1][instruction.name] = instruction
            root = instruction if match.group(1) else root
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text")
    return computations, entry


def constant_value(computation: Computation, name: str) -> int | None:
    """The integer a value is, following copies back to a scalar constant; None if it is not one."""
    instruction = computation.instructions.get(name)
    while instruction is not None and instruction.opcode in ("copy", "bitcast"):
        instruction = computation.instructions.get(instruction.operands[0])
    if instruction is None or instruction.opcode != "constant":
        return None
    value = instruction.rest.split(")", 1)[0]
    return int(value) if re.fullmatch(r"-?\d+", value) else None


def trip_count(computations: dict[str, Computation], host: Computation, loop: Instruction) -> int | None:
    """Trips of a while loop: XLA's annotation, else `counter < N` (or <=) on a counter that starts at a
    constant."""
    if annotated := TRIP_COUNT.search(loop.rest):
        return int(annotated.group(1))
    condition = computations[re.search(r"\bcondition=%?([\w.\-]+)", loop.rest).group(1)]
    compare = condition.root
    direction = re.search(r"\bdirection=(\w+)", compare.rest)
    if compare.opcode != "compare" or direction is None or len(compare.operands) != 2:
        return None
    counter, limit = compare.operands
    flipped = {"GT": "LT", "GE": "LE"}
    if constant_value(condition, counter) is not None:  # N > counter
        counter, limit, direction = limit, counter, flipped.get(direction.group(1))
    else:
        direction = direction.group(1)
    element = condition.instructions.get(counter)
    bound = constant_value(condition, limit)
    if direction not in ("LT", "LE") or bound is None or element is None:
        return None
    index = re.search(r"\bindex=(\d+)", element.rest)
    if element.opcode != "get-tuple-element" or index is None:
        return None
    init = host.instructions.get(loop.operands[0])
    if init is None or init.opcode != "tuple":
        return None
    start = constant_value(host, init.operands[int(index.group(1))])
    if start is None:
        return None
    trips = bound - start + (direction == "LE")
    return trips if trips > 0 else None


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


def collectives(hlo_text: str, num_devices: int) -> tuple[list[Collective], list[int | None]]:
    """The program's distinct collectives (see the module docstring), and the trip counts of its while
    loops (None: not readable, counted once)."""
    computations, entry = parse(hlo_text)
    found: dict[tuple, Collective] = {}
    loops: list[int | None] = []

    def visit(computation: Computation, executions: int, host: str) -> None:
        for instruction in computation.instructions.values():
            kind = instruction.opcode.removesuffix("-done")
            if kind in KINDS and not instruction.opcode.endswith("-start"):
                result = instruction.type
                if kind == "all-reduce" and computation.name.startswith("all-reduce-scatter"):
                    kind, result = "reduce-scatter", computation.root.type
                channel = CHANNEL.search(instruction.rest)
                key = (channel.group(1), host) if channel else (computation.name, instruction.name, host)
                size = group_size(instruction, num_devices)
                found.setdefault(key, Collective(kind, type_bytes(result), size, executions))
            trips = 1
            if instruction.opcode == "while":
                loops.append(trip_count(computations, computation, instruction))
                trips = loops[-1] or 1
            callees = [(role, name) for role, name in CALLEE.findall(instruction.rest)]
            for branches in BRANCHES.findall(instruction.rest):
                callees += [("branch", b.strip().lstrip("%")) for b in branches.split(",")]
            for role, name in callees:
                # a loop body or branch runs on its own (its host: the path of loops and conditionals to
                # it); a fusion or reducer runs within its caller's
                own = role in ("body", "condition", "branch")
                visit(computations[name], executions * trips, f"{host}/{instruction.name}" if own else host)

    visit(computations[entry], 1, entry)
    return list(found.values()), loops


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


KERNEL = re.compile(
    r"^\s+(?:ROOT\s+)?%?([A-Za-z_][\w\-]*?)(?:\.\d+)?\s*=.*custom_call_target=\"tpu_custom_call\"", re.M
)


def kernels(hlo_text: str) -> dict[str, int]:
    """The Pallas / Mosaic kernels a TPU program calls (its `tpu_custom_call`s), counted by name (e.g.
    splash attention's splash_mha_fwd_residuals, splash_mha_dq_no_residuals, splash_mha_dkv_no_residuals),
    each call site once (a call inside a loop body is not multiplied)."""
    return dict(sorted(collections.Counter(KERNEL.findall(hlo_text)).items()))
