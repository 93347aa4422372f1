"""What one compiled program costs each device, and a roofline estimate of its step time and MFU.

All figures are per device: XLA compiles one SPMD program that every device runs, and both its memory
analysis and its cost analysis describe that program (a matmul sharded over 4 devices reports a quarter
of the 1-device FLOPs; tests/parallel/test_compiled_report.py checks it).

XLA's cost analysis counts a while body once, whatever its trip count, and charges every operand of every
top-level op as memory traffic, VMEM buffers and whole sliced operands included. So the report counts
from the optimised HLO itself, every loop trip included: the matmul FLOPs (hlo_flops.py), the Pallas
kernels' FLOPs (splash attention, from their block grids), the HBM bytes as the chip moves them
(hlo_bytes.py: only buffers in HBM) and each collective's time over the links it uses
(hlo_collectives.py, interconnect.py); XLA's raw figures stay beside them.

Memory: arguments + outputs - aliased + temporaries + generated code is what the program holds live. A
donated argument whose buffer an output reuses is both an argument and an output; `alias` is that
overlap, counted once. `fits` compares it with the HBM libtpu makes available to a program (v5e: 15.75
of 16 GiB; tpu_topology.available_hbm_bytes), or the chip's HBM where no compiler says.

Roofline (docs/tpu_compile.md): compute (FLOPs over the peak), memory (HBM bytes over the HBM bandwidth)
and communication (the collectives' summed link time) are each a time the step cannot beat; the
estimate is the largest of the three, since XLA overlaps collectives with compute (async collectives)
and compute with memory (pipelined fusions). It is a lower bound: perfect overlap, peak FLOP/s. MFU =
the caller's model FLOPs (for the whole program on all devices) / (estimated step time x peak x
devices): the MFU the program would reach at its roofline, an upper bound (docs/tpu_compile.md has its
calibration against measured runs).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax

from t2mlr_jax.parallel.chips import GIB, Chip, chip_of
from t2mlr_jax.parallel.hlo import executed, kernels, parse
from t2mlr_jax.parallel.hlo_bytes import hbm_bytes
from t2mlr_jax.parallel.hlo_collectives import KINDS, collectives, each, in_loops, summary
from t2mlr_jax.parallel.hlo_flops import kernel_flops, matmul_flops
from t2mlr_jax.parallel.interconnect import Interconnect
from t2mlr_jax.parallel.tpu_topology import available_hbm_bytes

GB = 1e9
MEMORY_FIELDS = (
    "argument_bytes",
    "output_bytes",
    "alias_bytes",
    "temp_bytes",
    "generated_code_bytes",
    "total_bytes",
)


def program_devices(compiled: jax.stages.Compiled) -> list:
    """The devices a compiled program runs on, in its partition-id order (the order of its mesh, which
    its collectives' replica groups number), read off its argument and result shardings."""
    shardings = jax.tree.leaves((compiled.input_shardings, compiled.output_shardings))
    meshes = [s.mesh for s in shardings if isinstance(s, jax.sharding.NamedSharding)]
    if meshes and not meshes[0].empty:
        return list(meshes[0].devices.flat)
    return sorted({d for s in shardings for d in s.device_set}, key=lambda d: d.id)


def device_coords(devices: Sequence) -> list[list[int]] | None:
    """Each device's torus coordinates (TPU), in the given order; None where devices have none."""
    coords = [getattr(d, "coords", None) for d in devices]
    return None if any(c is None for c in coords) else [list(c) for c in coords]


def devices_per_chip(devices: Sequence) -> int:
    """Devices sharing the first one's chip (its `coords`): 2 on a v4 topology without megacore, else 1."""
    coords = getattr(devices[0], "coords", None)
    return sum(getattr(d, "coords", None) == coords for d in devices) if coords is not None else 1


def memory_per_device(compiled: jax.stages.Compiled) -> dict[str, int]:
    """XLA's memory analysis, and `total_bytes`: what the program holds live, a donated buffer once."""
    stats = compiled.memory_analysis()
    memory = {
        "argument_bytes": stats.argument_size_in_bytes,
        "output_bytes": stats.output_size_in_bytes,
        "alias_bytes": stats.alias_size_in_bytes,
        "temp_bytes": stats.temp_size_in_bytes,
        "generated_code_bytes": stats.generated_code_size_in_bytes,
    }
    live = ("argument_bytes", "output_bytes", "temp_bytes", "generated_code_bytes")
    memory["total_bytes"] = sum(memory[k] for k in live) - memory["alias_bytes"]
    return memory


def roofline(
    flops: float,
    memory_bytes: float,
    communication_s: float,
    device: Chip,
    devices: int,
    model_flops: float | None,
) -> dict[str, float | str | None]:
    """Step-time lower bound of a program on `devices` devices, each with `device`'s share of a chip."""
    times = {
        "compute": flops / device.peak_flops,
        "memory": memory_bytes / device.hbm_bytes_per_s,
        "communication": communication_s,
    }
    bound = max(times, key=times.get)
    step = times[bound]
    mfu = model_flops / (step * device.peak_flops * devices) if model_flops is not None and step > 0 else None
    return {**{f"{k}_s": v for k, v in times.items()}, "step_s": step, "bound": bound, "mfu": mfu}


def compiled_report(compiled: jax.stages.Compiled, model_flops: float | None = None) -> dict:
    """Memory, cost, collectives, kernels and roofline of a compiled program, per device, as a JSON-able
    dict. `model_flops`: the model's FLOPs for one run of the whole program (all devices), for the MFU (a
    train step: `Run.flops_per_step`, batch x `arch.train_flops(seq_len)`)."""
    devices = program_devices(compiled)
    cost = compiled.cost_analysis()
    return hlo_report(
        compiled.as_text(),
        memory_per_device(compiled),
        {"flops": float(cost.get("flops", 0.0)), "bytes_accessed": float(cost.get("bytes accessed", 0.0))},
        devices[0].device_kind,
        len(devices),
        devices_per_chip(devices),
        model_flops,
        device_coords(devices),
        available_hbm_bytes(devices[0]),
    )


def hlo_report(
    hlo_text: str,
    memory: dict,
    xla_cost: dict,
    device_kind: str,
    devices: int,
    per_chip: int = 1,
    model_flops: float | None = None,
    coords: list[list[int]] | None = None,
    available_hbm: float | None = None,
) -> dict:
    """`compiled_report` from what a compile leaves: its HLO text, `memory_per_device`, XLA's cost
    ({"flops", "bytes_accessed"}), its devices (kind, count, torus coordinates in partition order) and
    the HBM libtpu made available; so a kept HLO is reported again by the current code without compiling
    it again (experiments/tpu_scaling.py)."""
    device = chip_of(device_kind).split(per_chip)
    network = Interconnect.of(device, coords)
    module = parse(hlo_text)
    runs, loops = executed(module)
    ops = each(collectives(runs, devices), network)
    table = summary(ops)
    matmuls, kernel = matmul_flops(runs), kernel_flops(runs)
    flops = max(xla_cost["flops"], matmuls + kernel)
    hbm = hbm_bytes(module, runs)
    communication = sum(row["seconds"] for row in table.values())
    live = {k: memory[k] for k in MEMORY_FIELDS}
    allocatable = available_hbm or device.hbm_bytes
    return {
        "device_kind": device_kind,
        "chip": device.name,
        "chip_source": device.source,
        "devices": devices,
        "devices_per_chip": per_chip,
        "device_coords": coords,
        "memory": {
            **live,
            "hbm_bytes": device.hbm_bytes,
            "available_hbm_bytes": allocatable,
            "fits": live["total_bytes"] <= allocatable,
        },
        "cost": {
            "flops": flops,
            "xla_flops": xla_cost["flops"],
            "matmul_flops": matmuls,
            "kernel_flops": kernel,
            "hbm_bytes": hbm,
            "xla_bytes_accessed": xla_cost["bytes_accessed"],
            "traffic_bytes": sum(row["traffic_bytes"] for row in table.values()),
        },
        "collectives": table,
        "collective_ops": ops,
        "collectives_in_loops": in_loops(ops),
        "link_bytes_per_s": network.link_bytes_per_s,
        "kernels": kernels(hlo_text),
        "while_trip_counts": loops,
        "roofline": {
            "model_flops": model_flops,
            **roofline(flops, hbm, communication, device, devices, model_flops),
        },
    }


COLUMNS = (
    "program",
    "devices",
    "memory / available HBM (GiB)",
    "fits",
    "TFLOP",
    "HBM GB",
    *KINDS,
    "ICI GB",
    "compute ms",
    "memory ms",
    "comm ms",
    "step ms",
    "bound",
    "MFU",
)
MARKDOWN_HEADER = "| " + " | ".join(COLUMNS) + " |\n" + "|---" * len(COLUMNS) + "|"


def markdown_row(program: str, report: dict) -> str:
    """One row under MARKDOWN_HEADER: per-device figures, each collective kind as `count x MB` (the mean
    result size of one execution)."""
    memory, cost, line = report["memory"], report["cost"], report["roofline"]
    kinds = [
        f"{row['count']} x {row['bytes'] / row['count'] / 1e6:.3g} MB" if row["count"] else "-"
        for row in report["collectives"].values()
    ]
    mfu = "-" if line["mfu"] is None else f"{100 * line['mfu']:.1f}%"
    cells = [
        program,
        f"{report['devices']} x {report['chip']}",
        f"{memory['total_bytes'] / GIB:.2f} / {memory['available_hbm_bytes'] / GIB:.2f}",
        "yes" if memory["fits"] else "**no**",
        f"{cost['flops'] / 1e12:.3g}",
        f"{cost['hbm_bytes'] / GB:.3g}",
        *kinds,
        f"{cost['traffic_bytes'] / GB:.3g}",
        *(f"{1e3 * line[k]:.3g}" for k in ("compute_s", "memory_s", "communication_s", "step_s")),
        line["bound"],
        mfu,
    ]
    return "| " + " | ".join(cells) + " |"
