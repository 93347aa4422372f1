"""Ahead-of-time compiles for a TPU pod from any host, this CPU included: libtpu's compiler builds each
program of an architecture (`Programs`: the train step, the eval forward, the cached decode step, T²MLR's
Jacobi prefill) for a topology's devices, exactly as the trainer and the generator build it (the same
rule table, shardings, donation, remat, dtypes) and with the TPU's kernels (`target_platform` reads the
mesh's devices). Nothing runs: the compiled programs are for their memory, cost and collectives
(t2mlr_jax.parallel.compiled).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Hashable
from typing import Any

import jax
from jax.sharding import Mesh

from t2mlr_jax.architectures import Architecture
from t2mlr_jax.config.sections import Experiment
from t2mlr_jax.parallel.mesh import check_batch, check_experts, make_mesh, parse_mesh
from t2mlr_jax.parallel.tpu_topology import OUT_OF_HBM, UNITS, topology_devices
from t2mlr_jax.train.programs import Programs

PROGRAMS = ("train", "eval", "decode", "jacobi_prefill")
NO_CACHE = "no KV cache: it decodes by re-running its eval forward over the sequence, once per token"


def topology_mesh(topology: str, mesh: str) -> Mesh:
    devices = topology_devices(topology)
    try:
        return make_mesh(**parse_mesh(mesh), devices=devices)
    except (ValueError, NotImplementedError) as e:  # (NotImplementedError: no layout on the torus)
        raise ValueError(f"--mesh={mesh!r} on {topology} ({len(devices)} chips): {e}") from None


@dataclasses.dataclass
class Compiled:
    """One program's compile: `compiled` (None when it failed: `error` says why; `needs_temp_bytes` when
    the compiler refused it for not fitting the chip's HBM), the seconds it took, and `sample`, the
    architecture's per-step choice the train step was built for."""

    arch: str
    program: str
    seconds: float = 0.0
    compiled: Any = None
    error: str | None = None
    needs_temp_bytes: float | None = None
    sample: dict | None = None


def check_shapes(config: Experiment, arch: Architecture, mesh: Mesh, batch: int, seq_len: int) -> None:
    """Everything that would fail at compile time for a reason of the input, as one clear error first."""
    check_batch(batch, mesh, config.train.grad_accum)
    if arch.backbone is not None and arch.backbone.routed_experts:
        check_experts(arch.backbone.routed_experts, mesh)
    if arch.max_seq_len is not None and seq_len > arch.max_seq_len:
        raise ValueError(f"{arch.name}: --seq_len={seq_len} exceeds its max_seq_len {arch.max_seq_len}")


def build(programs: Programs, program: str, batch: int, seq_len: int, sample: Hashable | None):
    """(jitted function, abstract args) of `program`, or None where the architecture has no such program
    (no KV cache to decode with; a Jacobi prefill outside T²MLR)."""
    if program == "train":
        return programs.train_program(batch, seq_len, sample)
    if program == "eval":
        return programs.eval_program(batch, seq_len)
    if program == "decode":
        return programs.decode_program(batch, seq_len)
    if program == "jacobi_prefill":
        return programs.jacobi_prefill_program(batch, seq_len)
    raise ValueError(f"program must be one of {PROGRAMS}, got {program!r}")


def compile_program(
    programs: Programs, program: str, batch: int, seq_len: int, sample: Hashable | None = None
) -> Compiled | None:
    """`program` compiled for the programs' mesh; a failure is recorded (`Compiled.error`), not raised."""
    arch = programs.arch.name
    record = Compiled(arch, program, sample=None if sample is None else sample._asdict())
    started = time.perf_counter()
    try:
        built = build(programs, program, batch, seq_len, sample)
        if built is None:
            return None
        fn, args = built
        with jax.set_mesh(programs.mesh):
            record.compiled = fn.trace(*args).lower().compile()
    except Exception as e:  # noqa: BLE001 -- one line naming the program and XLA's (or our) reason
        record.error = f"{type(e).__name__}: {' '.join(str(e).split())[:500]}"
        if found := OUT_OF_HBM.search(str(e)):
            record.needs_temp_bytes = float(found.group(1)) * UNITS[found.group(2)]
    record.seconds = time.perf_counter() - started
    return record
