"""HBM traffic of a compiled program's loops, which XLA's cost analysis counts once per loop body whatever
its trip count (t2mlr_jax/parallel/compiled_report.py adds the other trips to XLA's bytes accessed).

An instruction that runs on its own (not inside a fusion) reads its operands and writes its result, each
from HBM: its bytes are their sizes, with two exceptions XLA's analysis makes too. A fusion parameter that
the fusion only dynamic-slices reads the slices (a scan over stacked layer weights reads one layer per
trip), and a dynamic-update-slice (in place) writes and reads its update, not the whole buffer. Ops that
move no data (tuples, bitcasts, parameters, constants, a loop or conditional itself, the done half of an
async pair) cost nothing.
"""

from __future__ import annotations

from t2mlr_jax.parallel.hlo import CALLEE, Computation, Executed, Instruction, Module, type_bytes

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


def _fused(module: Module, instruction: Instruction) -> Computation | None:
    called = [name for role, name in CALLEE.findall(instruction.rest) if role == "calls"]
    return module.computations.get(called[0]) if instruction.opcode == "fusion" and called else None


def _operand_bytes(module: Module, host: Computation, instruction: Instruction) -> float:
    """What an instruction reads: each operand whole, or what its fusion slices of it."""
    fused = _fused(module, instruction)
    params = {}
    if fused is not None:
        for inner in fused.instructions.values():
            if inner.opcode == "parameter":
                params[int(inner.rest.split(")", 1)[0])] = inner.name
    total = 0.0
    for position, name in enumerate(instruction.operands):
        operand = host.instructions.get(name)
        if operand is None:
            continue
        users = [] if position not in params else _users(fused, params[position])
        if users and all(u.opcode == "dynamic-slice" and u.operands[0] == params[position] for u in users):
            total += sum(type_bytes(u.type) for u in users)
        else:
            total += type_bytes(operand.type)
    return total


def _users(computation: Computation, name: str) -> list[Instruction]:
    return [i for i in computation.instructions.values() if name in i.operands]


def instruction_bytes(module: Module, run: Executed) -> float:
    """HBM bytes one execution of `run`'s instruction moves (0 for one fused into another)."""
    instruction, host = run.instruction, run.computation
    if instruction.opcode in FREE or instruction.opcode.endswith("-done"):
        return 0.0
    fused = _fused(module, instruction)
    in_place = fused is not None and fused.root is not None and fused.root.opcode == "dynamic-update-slice"
    if instruction.opcode == "dynamic-update-slice" or in_place:
        root = instruction if not in_place else fused.root
        computation = host if not in_place else fused
        update = computation.instructions.get(root.operands[1])
        return 2.0 * (type_bytes(update.type) if update is not None else 0.0)
    return type_bytes(instruction.type) + _operand_bytes(module, host, instruction)


def extra_loop_bytes(module: Module, executed: list[Executed]) -> float:
    """The HBM bytes of every loop trip after the first: what XLA's once-per-body count leaves out."""
    fused = {
        name
        for c in module.computations.values()
        for i in c.instructions.values()
        for role, name in CALLEE.findall(i.rest)
        if role in ("calls", "to_apply")
    }
    return (
        sum(
            (run.executions - 1.0) * instruction_bytes(module, run)
            for run in executed
            if run.executions > 1 and run.computation.name not in fused
        )
        + 0.0
    )
