"""HBM traffic of a compiled program, counted as the chip moves it: every executed instruction (every loop
trip included) reads its operands and writes its result, each only where the buffer lives in HBM.

XLA's cost analysis ("bytes accessed") charges every operand and result of every top-level instruction,
once per loop body whatever its trip count, including buffers that memory-space assignment placed in
VMEM (layout `S(1)`: their HBM side is the prefetch or eviction that filled or emptied them, counted
there) and the whole operand of each async slice. Here, per instruction outside a fusion:
- an array in memory space 0 (HBM) is read or written; one in another space (VMEM, SMEM, sync flags) is
  not HBM traffic;
- `copy-start` moves its operand to its destination (result element 0): each side that is in HBM;
- `slice-start` reads, of its operand, only the slice (its destination) and writes the destination;
- another `-start` (collective-permute, all-gather, ...) reads its operands and writes its result's
  arrays after the operand aliases it begins with; the `-done` half moves nothing new;
- a slice reads only what it takes, and so does a fusion whose parameter is only sliced inside it (a
  scan over stacked layer weights reads one layer per trip);
- a dynamic-update-slice (or a fusion output that is one, of a fusion parameter) is in place: it writes
  its update and does not read the buffer it updates;
- libtpu's async collective fusions run one collective as steps spread over many fusions, each showing
  the whole collective and passing the buffers on: a fusion output that is a parameter passed through
  aliases it (neither read nor written), and one that is a collective's result is not charged (its
  bytes are the collective's, timed on the links);
- ops that move no data (tuples, bitcasts, parameters, constants, a loop or conditional itself) cost
  nothing.
Kernels (Pallas custom calls) are charged their operands and results once: what they re-read from HBM
inside their grid is not visible in the HLO.
"""

from __future__ import annotations

from t2mlr_jax.parallel.hlo import (
    CALLEE,
    HBM,
    Computation,
    Executed,
    Instruction,
    Module,
    arrays,
    type_bytes,
)

FREE = {
    "parameter",
    "constant",
    "tuple",
    "get-tuple-element",
    "bitcast",
    "while",
    "conditional",
    "call",
    "after-all",
    "partition-id",
    "replica-id",
    "opt-barrier",
}
SLICES = ("slice", "dynamic-slice")
COLLECTIVES = {"all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute"}
VMEM = 1  # TPU's memory space 1


def _fused(module: Module, instruction: Instruction) -> Computation | None:
    called = [name for role, name in CALLEE.findall(instruction.rest) if role == "calls"]
    return module.computations.get(called[0]) if instruction.opcode == "fusion" and called else None


def _users(computation: Computation, name: str) -> list[Instruction]:
    return [i for i in computation.instructions.values() if name in i.operands]


def _hbm(sizes: list[tuple[float, int]]) -> float:
    return sum((size for size, space in sizes if space == HBM), 0.0)


def _operand_types(host: Computation, instruction: Instruction) -> list[str]:
    return [host.instructions[name].type for name in instruction.operands if name in host.instructions]


def _param_index(parameter: Instruction) -> int:
    return int(parameter.rest.split(")", 1)[0])


def _read_bytes(module: Module, host: Computation, instruction: Instruction, skip: set[int]) -> float:
    """What an instruction reads from HBM: each operand in HBM whole, or the slices its fusion takes;
    operands at `skip` (buffers it updates in place) are not read."""
    fused = _fused(module, instruction)
    params = {}
    if fused is not None:
        params = {_param_index(i): i.name for i in fused.instructions.values() if i.opcode == "parameter"}
    total = 0.0
    for position, name in enumerate(instruction.operands):
        operand = host.instructions.get(name)
        if operand is None or position in skip:
            continue
        users = [] if position not in params else _users(fused, params[position])
        if users and all(u.opcode in SLICES and u.operands[0] == params[position] for u in users):
            if type_bytes(operand.type, HBM):
                total += sum(type_bytes(u.type) for u in users)
        else:
            total += type_bytes(operand.type, HBM)
    return total


def _fusion_bytes(module: Module, host: Computation, instruction: Instruction, fused: Computation) -> float:
    """A fusion writes each output in HBM, an in-place one (a dynamic-update-slice of a parameter) only
    its update, and reads its operands but the buffers it updates."""
    result = arrays(instruction.type)
    root = fused.root
    outputs = [fused.instructions[n] for n in root.operands] if root.opcode == "tuple" else [root]
    if len(outputs) != len(result):  # an output that is itself a tuple: every array written
        return _hbm(result) + _read_bytes(module, host, instruction, set())
    written, in_place = 0.0, set()
    for output, (size, space) in zip(outputs, result):
        if output.opcode == "parameter":  # passed through (an async collective's buffer): aliased, not moved
            if all(user is root for user in _users(fused, output.name)):
                in_place.add(_param_index(output))
            continue
        if output.opcode in COLLECTIVES:  # an async collective fusion's step: the link time counts it
            continue
        if output.opcode != "dynamic-update-slice":
            written += size if space == HBM else 0.0
            continue
        buffer, update = (fused.instructions.get(name) for name in output.operands[:2])
        written += type_bytes(update.type) if update is not None and space == HBM else 0.0
        if buffer is not None and buffer.opcode == "parameter":
            in_place.add(_param_index(buffer))
    return written + _read_bytes(module, host, instruction, in_place)


def instruction_bytes(module: Module, run: Executed) -> float:
    """HBM bytes one execution of `run`'s instruction moves (see the module docstring)."""
    instruction, host = run.instruction, run.computation
    opcode = instruction.opcode
    if opcode in FREE or opcode.endswith("-done"):
        return 0.0
    result = arrays(instruction.type)
    if opcode == "copy-start":  # (destination, source alias, context)
        return _hbm(arrays(" ".join(_operand_types(host, instruction)))) + _hbm(result[:1])
    if opcode.endswith("-start"):  # (operand aliases..., destination, contexts in sync-flag memory)
        operands = arrays(" ".join(_operand_types(host, instruction)))
        destination = [a for a in result[len(operands) :] if a[1] in (HBM, VMEM)]
        if opcode == "slice-start":  # reads of its operand only the slice it takes
            return sum(size for size, _ in destination) * (_hbm(operands) > 0) + _hbm(destination)
        return _hbm(operands) + _hbm(destination)
    fused = _fused(module, instruction)
    if fused is not None and fused.root is not None:
        return _fusion_bytes(module, host, instruction, fused)
    if opcode in SLICES:  # reads only what it takes
        source = host.instructions.get(instruction.operands[0])
        taken = type_bytes(instruction.type) if source is not None and type_bytes(source.type, HBM) else 0.0
        return _hbm(result) + taken + _read_bytes(module, host, instruction, {0})
    if opcode == "dynamic-update-slice":  # in place: writes its update into operand 0, reads the rest
        update = host.instructions.get(instruction.operands[1])
        written = type_bytes(update.type) if update is not None and _hbm(result) else 0.0
        return written + _read_bytes(module, host, instruction, {0})
    return _hbm(result) + _read_bytes(module, host, instruction, set())


def fused_computations(module: Module) -> set[str]:
    """Computations that run inside their caller: fusions' bodies and reducers (a `call`'s or an async
    op's callee runs on its own)."""
    return {
        name
        for c in module.computations.values()
        for i in c.instructions.values()
        for role, name in CALLEE.findall(i.rest)
        if (role == "calls" and i.opcode == "fusion") or (role == "to_apply" and i.opcode != "call")
    }


def hbm_bytes(module: Module, executed: list[Executed]) -> float:
    """HBM bytes one run of the program moves, every loop trip included."""
    inside = fused_computations(module)
    return sum(
        run.executions * instruction_bytes(module, run)
        for run in executed
        if run.computation.name not in inside
    )
