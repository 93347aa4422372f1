"""Reading an optimised HLO module's text (`compiled.as_text()`): its computations, the trip counts of its
while loops, and every instruction with how many times one run of the program executes it.

A while loop's trip count is XLA's `known_trip_count` annotation where the text has one (GPU), else read
off the loop itself: a condition `counter < N` (or <=) on a tuple element whose initial value is a
constant and which the body's root raises by a constant (TPU keeps no annotation in its text; its
windowed einsums count by 2). A loop whose count cannot be read counts once (its trip
count: None). Both branches of a conditional count, an upper bound.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re

COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s+\(.*->.*\{\s*$")
# `  [ROOT] %name = <type> opcode(operands), attributes`: the type may be a tuple, so the opcode is the
# first word after whitespace that opens a parenthesis.
INSTRUCTION = re.compile(r"^\s+(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.+?)\s+([a-z][\w\-]*)\((.*)$")
ARRAY = re.compile(r"\b([a-z]\w*)\[([\d,]*)\](\{[^}]*\})?")
# A layout's memory space: `{1,0:T(8,128)(2,1)S(1)}` is in space 1 (TPU: VMEM); no S(n): space 0, HBM
MEMORY_SPACE = re.compile(r"S\((\d+)\)")
HBM = 0
CALLEE = re.compile(r"\b(calls|to_apply|body|condition|true_computation|false_computation)=%?([\w.\-]+)")
BRANCHES = re.compile(r"\bbranch_computations=\{([^}]*)\}")
# a computation's last line; v5p's SparseCore offloads name their thread: `}, execution_thread="sparsecore"`
CLOSING = re.compile(r"^\}(,\s*execution_thread=\S+)?\s*$")
TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


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
    root: Instruction | None  # None: a computation printed without a ROOT line


@dataclasses.dataclass(frozen=True)
class Module:
    computations: dict[str, Computation]
    entry: str


@dataclasses.dataclass(frozen=True)
class Executed:
    """An instruction, the computation it is in, and how often one run executes it. `host`: the path of
    loops and conditionals it runs in (a fusion or reducer runs within its caller's)."""

    instruction: Instruction
    computation: Computation
    executions: int
    host: str


def dims(hlo_type: str) -> list[int]:
    """The dimensions of an array type (`bf16[64,512]{1,0:T(8,128)}` -> [64, 512])."""
    return [int(d) for d in ARRAY.search(hlo_type).group(2).split(",") if d]


def arrays(hlo_type: str) -> list[tuple[float, int]]:
    """(bytes, memory space) of each array of an HLO type (a tuple: each of its arrays, in order): elements
    times the bits in the dtype's name (bf16: 16, f8e4m3fn: 8, c64: 64), pred one byte."""
    found = []
    for dtype, shape, layout in ARRAY.findall(hlo_type):
        digits = re.search(r"\d+", dtype)
        bits = 8 if dtype == "pred" else int(digits.group()) if digits else 0
        space = MEMORY_SPACE.search(layout)
        size = math.prod(int(d) for d in shape.split(",") if d) * bits / 8
        found.append((size, int(space.group(1)) if space else HBM))
    return found


def type_bytes(hlo_type: str, space: int | None = None) -> float:
    """Bytes of an HLO type (a tuple: its arrays summed), or of its arrays in memory `space` only."""
    return sum((size for size, where in arrays(hlo_type) if space is None or where == space), 0.0)


def parse(hlo_text: str) -> Module:
    """The computations of an HLO module's text, by name."""
    computations, entry, current, root = {}, None, None, None
    for line in hlo_text.splitlines():
        if current is None:
            header = COMPUTATION.match(line)
            if header:
                current, root = (header.group(1), {}), None
                entry = header.group(1) if line.startswith("ENTRY") else entry
        elif CLOSING.match(line):  # (an attribute can span lines: a Pallas kernel's config starts "}}, ")
            computations[current[0]] = Computation(current[0], current[1], root)
            current = None
        elif match := INSTRUCTION.match(line):
            instruction = Instruction(match.group(2), match.group(3), match.group(4), match.group(5))
            current[1][instruction.name] = instruction
            root = instruction if match.group(1) else root
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text")
    return Module(computations, entry)


def constant_value(computation: Computation, name: str) -> int | None:
    """The integer a value is, following copies back to a scalar constant; None if it is not one."""
    instruction = computation.instructions.get(name)
    while instruction is not None and instruction.opcode in ("copy", "bitcast"):
        instruction = computation.instructions.get(instruction.operands[0])
    if instruction is None or instruction.opcode != "constant":
        return None
    value = instruction.rest.split(")", 1)[0]
    return int(value) if re.fullmatch(r"-?\d+", value) else None


def _step(module: Module, loop: Instruction, index: int) -> int:
    """How much a loop's body adds to its counter (tuple element `index`) per trip: `counter + c` read
    off the body's root; 1 where the update is not that form. XLA's windowed einsums count by 2."""
    body = module.computations[re.search(r"\bbody=%?([\w.\-]+)", loop.rest).group(1)]
    if body.root is None or body.root.opcode != "tuple" or index >= len(body.root.operands):
        return 1
    update = body.instructions.get(body.root.operands[index])
    if update is None or update.opcode != "add":
        return 1
    steps = [constant_value(body, name) for name in update.operands]
    return next((int(c) for c in steps if c is not None and c > 0), 1)


def trip_count(module: Module, host: Computation, loop: Instruction) -> int | None:
    """Trips of a while loop: XLA's annotation, else `counter < N` (or <=) on a counter that starts at a
    constant and grows by a constant step."""
    if annotated := TRIP_COUNT.search(loop.rest):
        return int(annotated.group(1))
    condition = module.computations[re.search(r"\bcondition=%?([\w.\-]+)", loop.rest).group(1)]
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
    step = _step(module, loop, int(index.group(1)))
    span = bound - start + (direction == "LE")
    trips = -(-span // step)  # ceil
    return trips if trips > 0 else None


def executed(module: Module) -> tuple[list[Executed], list[int | None]]:
    """Every instruction reachable from the entry, once per calling context, and the trip counts of the
    while loops met (None: not readable, counted once)."""
    found: list[Executed] = []
    loops: list[int | None] = []

    def visit(computation: Computation, executions: int, host: str) -> None:
        for instruction in computation.instructions.values():
            found.append(Executed(instruction, computation, executions, host))
            trips = 1
            if instruction.opcode == "while":
                loops.append(trip_count(module, computation, instruction))
                trips = loops[-1] or 1
            callees = CALLEE.findall(instruction.rest)
            for branches in BRANCHES.findall(instruction.rest):
                callees += [("branch", b.strip().lstrip("%")) for b in branches.split(",")]
            for role, name in callees:
                # a loop's body or a conditional's branch runs on its own; a fusion or reducer in its caller
                path = host if role in ("calls", "to_apply") else f"{host}/{instruction.name}"
                visit(module.computations[name], executions * trips, path)

    visit(module.computations[module.entry], 1, module.entry)
    return found, loops


KERNEL = re.compile(
    r"^\s+(?:ROOT\s+)?%?([A-Za-z_][\w\-]*?)(?:\.\d+)?\s*=.*custom_call_target=\"tpu_custom_call\"", re.M
)


def kernels(hlo_text: str) -> dict[str, int]:
    """The Pallas / Mosaic kernels a TPU program calls (its `tpu_custom_call`s), counted by name (e.g.
    splash attention's splash_mha_fwd_segmented_residuals, splash_mha_dq_segmented_no_residuals, ...),
    each call site once (a call inside a loop body is not multiplied)."""
    return dict(sorted(collections.Counter(KERNEL.findall(hlo_text)).items()))
