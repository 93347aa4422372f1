#!/usr/bin/env python
"""TPU pods, compiled for real from this CPU: tools/aot_compile.py run once per row of a study, each in its
own process, and the rows gathered into one table.

  python -m experiments.tpu_scaling --study=coverage   # every architecture, tiny, on v5e:2x2, v5e:16x16
                                                       # and v5p:4x4x4: train, eval, decode, Jacobi prefill
  python -m experiments.tpu_scaling --study=pods       # the README's table: SmolLM2-135M / 360M / 1B T²MLR
                                                       # and transformer at seq 2048, each recipe at its
                                                       # planned ZeRO stage and rows per chip and at 1, 4
                                                       # and 8 rows per chip, the LRT's paper sizes, on
                                                       # v5e-256, v5p-64 and v6e-64; the largest T²MLR
                                                       # that fits v5e-256
  python -m experiments.tpu_scaling --study=pods --rows=135M_v5e-256   # one row
  python -m experiments.tpu_scaling --study=calibration  # MaxText's measured runs at their shapes, the
                                                       # estimate beside each measurement

Each row's tool run writes <out>/<row>/aot.json, aot.md and the compiled HLO; a rerun skips rows whose
aot.json exists (--force recompiles). Written to --out (default runs/tpu_<study>): scaling.json (every
row's setting and per-program reports), scaling.md (the table; also printed). Compiles of the paper
sizes take minutes each and several GB of memory: --jobs runs rows side by side (default 1).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gzip
import json
import math
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

from tqdm import tqdm

from t2mlr_jax import cpu_runtime
from t2mlr_jax.architectures import Architecture, build_architecture
from t2mlr_jax.config.edit import config_module
from t2mlr_jax.config.sections import Experiment
from t2mlr_jax.experiment import resolve
from t2mlr_jax.parallel.chips import chip_of
from t2mlr_jax.parallel.compiled_report import hlo_report
from t2mlr_jax.parallel.mesh import parse_mesh
from t2mlr_jax.train import memory_plan

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "aot_compile.py"


class Row(NamedTuple):
    name: str
    config: str
    arch: str
    topology: str
    mesh: str
    batch: int
    seq_len: int
    programs: str = "train,decode"
    overrides: tuple[str, ...] = ()
    zero: int = 3  # mesh.zero


class Pod(NamedTuple):
    topology: str
    mesh: str  # data parallel over every chip (on v5e-256, fsdp along a 16-chip ring of the torus)
    chips: int
    device_kind: str  # its chip's, in parallel.chips


# Pods: rows of 2048 tokens, each recipe at the ZeRO stage and rows per chip its plan gives
# (`recipe_plan`), the T²MLR sizes also at 1, 4 and 8 rows per chip; experts over `expert`. The train step
# is compiled without gradient accumulation.
SEQ_LEN = 2048
PODS = {
    "v5e-256": Pod("v5e:16x16", "data:16,fsdp:16", 256, "TPU v5 lite"),
    "v5p-64": Pod("v5p:4x4x4", "fsdp:64", 64, "TPU v5"),
    "v6e-64": Pod("v6e:8x8", "fsdp:64", 64, "TPU v6 lite"),
}
# The LRT's experts over `expert` where that fits more rows per chip than the pod's own mesh: at its paper
# sizes each chip holds every expert, and expert parallelism's dispatch (each device runs its expert peers'
# tokens through the sort and combine) cost the d16 on v5p-64 14.5% MFU at one row, against 24.5% without.
EXPERT_MESH = {"v5e-256": "data:4,fsdp:8,expert:8", "v5p-64": "fsdp:8,expert:8", "v6e-64": "fsdp:8,expert:8"}
T2MLR_SIZES = {
    "135M": "configs/smollm135m_t2mlr.py:w13_18",  # the paper's (13,18) D=16 B=4
    "360M": "configs/smollm360m_t2mlr.py",
    "1B": "configs/smollm1b_t2mlr.py",
}
LRT_SIZES = {"LRT-d16": "configs/lrt_nanochat.py", "LRT-d20": "configs/lrt_nanochat.py:d20"}
# The next sizes up on smollm1b's recipe (window (9,24), D=16, B=4), for the largest T²MLR that fits
# v5e-256: its state over all 256 chips (fsdp:256: the least each chip holds), with the recipe's remat
# ("dots") and with full remat (only the blocks' inputs kept for the backward).
THREE_B = ("hidden_size=3072", "num_heads=24", "num_kv_heads=8", "mlp_dim=8192", "num_layers=28")
EIGHT_B = ("hidden_size=4096", "num_heads=32", "num_kv_heads=8", "mlp_dim=14336", "num_layers=32")
LARGER = {"3B": THREE_B, "3B-remat": (*THREE_B, "remat=full"), "8B-remat": (*EIGHT_B, "remat=full")}
NO_ACC = ("--config.train.grad_accum=1",)


# The T²MLR sizes' train steps at each of these rows per chip besides their plan's: rows `_x1`, `_x4`, `_x8`
STUDY_ROWS_PER_CHIP = (1, 4, 8)


def kept_passes(config: Experiment, arch: Architecture) -> tuple[int, int]:
    """(layer passes whose activations a training row's backward keeps, passes whose logits its loss
    reads): T²MLR's window once more for each of its B - 1 further differentiated Jacobi passes; the LRT's
    every layer and logits at its most passes (1 + max P); one pass otherwise."""
    model = arch.backbone
    if arch.name == "lrt":
        passes = 1 + max(config.lrt.passes)
        return model.num_layers * passes, passes
    if model.recurrence is None:
        return model.num_layers, 1
    first, last = model.recurrence.layer_range(model.num_layers)
    return model.num_layers + (model.recurrence.d_backward - 1) * (last - first + 1), 1


def recipe_workloads(config_file: str, archs: str, mesh: str) -> list[memory_plan.Workload]:
    """What training each architecture of `archs` (a comma list) of the config file ("path:preset") costs a
    chip of `mesh` (memory_plan.workload), at the pods' row length."""
    path, _, preset = config_file.partition(":")
    config = resolve(config_module(path).get_config(preset or None))
    works = []
    for name in archs.split(","):
        arch = build_architecture(config, name)
        passes = kept_passes(config, arch)
        works.append(
            memory_plan.workload(arch.backbone, arch.num_params(), SEQ_LEN, *passes, parse_mesh(mesh))
        )
    return works


@functools.cache
def recipe_plan(config_file: str, archs: str, pod_name: str, mesh: str) -> memory_plan.Plan:
    """The ZeRO stage and rows per chip of `mesh` on the pod at which every architecture of `archs` fits its
    chips' HBM (memory_plan.plan)."""
    works = recipe_workloads(config_file, archs, mesh)
    return memory_plan.plan(works, chip_of(PODS[pod_name].device_kind), mesh)


def recipe_rows(
    size: str, config: str, archs: str, pod_name: str, meshes: tuple[str, ...], study: tuple[int, ...] = ()
) -> list[Row]:
    """The recipe's row `SIZE_POD` at its plan (`recipe_plan`), train and decode; and its train step at
    each other rows-per-chip count of `study`, `SIZE_POD_xN`, on the same mesh and ZeRO stage. Of the
    candidate `meshes`, the plan with the most rows per chip; ties go to the first."""
    pod = PODS[pod_name]
    plan = max((recipe_plan(config, archs, pod_name, mesh) for mesh in meshes), key=lambda p: p.rows_per_chip)
    name = f"{size}_{pod_name}"

    def row(suffix: str, per_chip: int, programs: str) -> Row:
        batch = pod.chips * per_chip
        return Row(
            name + suffix, config, archs, pod.topology, plan.mesh, batch, SEQ_LEN, programs, NO_ACC, plan.zero
        )

    others = [row(f"_x{n}", n, "train") for n in study if n != plan.rows_per_chip]
    return [row("", plan.rows_per_chip, "train,decode"), *others]


def pod_rows() -> list[Row]:
    rows = [
        row
        for size, config in T2MLR_SIZES.items()
        for pod in PODS
        for row in recipe_rows(size, config, "t2mlr,transformer", pod, (PODS[pod].mesh,), STUDY_ROWS_PER_CHIP)
    ]
    rows += [
        row
        for size, config in LRT_SIZES.items()
        for pod in PODS
        for row in recipe_rows(size, config, "lrt", pod, (PODS[pod].mesh, EXPERT_MESH[pod]))
    ]
    pod = PODS["v5e-256"]
    rows += [
        Row(
            f"{size}_v5e-256_fsdp",
            "configs/smollm1b_t2mlr.py",
            "t2mlr",
            pod.topology,
            "fsdp:256",
            pod.chips,
            SEQ_LEN,
            "train",
            NO_ACC + tuple(f"--config.model.{field}" for field in fields),
        )
        for size, fields in LARGER.items()
    ]
    return rows


# Coverage: every architecture at a CPU preset's size, 128-token rows (splash attention's block), one row
# per data-parallel device, on three topologies; tensor and expert axes exercised where they divide.
COVERAGE_TOPOLOGIES = {
    "v5e:2x2": ("fsdp:2,tensor:2", "fsdp:2,expert:2", 4),
    "v5e:16x16": ("data:16,fsdp:16", "data:4,fsdp:8,expert:8", 256),
    "v5p:4x4x4": ("fsdp:16,tensor:4", "fsdp:8,expert:8", 64),
}
COVERAGE_MODELS = (
    ("backbone", "configs/smollm135m_t2mlr.py:cpu", "t2mlr,transformer,looped,pause", False),
    ("thoughts", "configs/lrt_nanochat.py:cpu", "lrt,ponderlm2", True),
    ("recirculation", "configs/recirculation.py:cpu", "recirculation", False),
)
ROOM = ("--config.model.max_seq_len=512",)  # the :cpu presets' rows are shorter than a splash block


def coverage_rows() -> list[Row]:
    rows = []
    for topology, (mesh, expert_mesh, batch) in COVERAGE_TOPOLOGIES.items():
        for label, config, arch, experts in COVERAGE_MODELS:
            name = f"{label}_{topology.replace(':', '-')}"
            programs = "train,eval,decode,jacobi_prefill"
            row_mesh = expert_mesh if experts else mesh
            rows.append(Row(name, config, arch, topology, row_mesh, batch, 128, programs, ROOM))
    return rows


# Calibration: MaxText's published measured runs (train step, bf16 compute, fp32 weights, AdamW), compiled
# with our own backbone at their shapes (layers scanned, as MaxText's are) and estimated beside the
# measurement. MaxText's model FLOPs convention (`maxtext_flops`) turns both into MFU.
@dataclasses.dataclass(frozen=True)
class Anchor:
    name: str  # ..._<pod>, the pod named as MaxText names it (v5e-256: 256 chips; v5p-128: 64)
    topology: str
    mesh: str
    batch: int  # rows: per_device_batch_size x chips
    seq_len: int
    model: dict  # ModelConfig fields
    remat: str  # ours; MaxText's named in `differs`
    mfu: float  # measured
    source: str  # where the measured MFU is published
    differs: str  # what our compile does otherwise than theirs


# MaxText's 2023 base model (its base.yml when the v5e / v5p tables were measured, commit 76bd53b0f):
# relu MLP, MHA, head_dim 256, tied logits, vocab 32768; global_parameter_scale 16 doubles heads and MLP
# and the layers (5120 wide, 32 x 256 heads, MLP 32768, 32 layers), 32 also the width (10240).
MAXTEXT_2023 = dict(vocab_size=32768, head_dim=256, mlp="relu2", tie_embeddings=True, num_layers=32)
SCALE_16 = dict(MAXTEXT_2023, hidden_size=5120, num_heads=32, num_kv_heads=32, mlp_dim=32768)
SCALE_32 = dict(SCALE_16, hidden_size=10240)
# Llama 3.1 8B's shape, which Mixtral 8x7B shares (its experts are Mistral 7B's MLP)
LLAMA_8B_SHAPE = dict(
    hidden_size=4096,
    num_heads=32,
    num_kv_heads=8,
    head_dim=128,
    mlp_dim=14336,
    num_layers=32,
    tie_embeddings=False,
)
LLAMA31_8B = dict(LLAMA_8B_SHAPE, vocab_size=128256, max_seq_len=8192)
MIXTRAL_8X7B = dict(
    LLAMA_8B_SHAPE,
    vocab_size=32000,
    max_seq_len=4096,
    mlp="moe",
    moe_experts=8,
    moe_top_k=2,
    moe_shared=0,
    moe_capacity_factor=1.25,
    moe_capacity_groups="row",  # MaxText's capacity: per sequence
)
RELU = "relu² where MaxText's MLP is relu (the same matmuls)"
CUSTOM = "remat full where MaxText's custom policy offloads the block input and q/k/v/o projections to host"
MAXTEXT = "https://github.com/AI-Hypercomputer/maxtext"
ANCHORS = (
    Anchor(
        "maxtext-16B_v5e-256",
        "v5e:16x16",
        "fsdp:256",
        6 * 256,
        2048,
        SCALE_16,
        "full",
        0.6110,
        f"{MAXTEXT} configs/v5e/README.md, 16b.sh",
        RELU,
    ),
    Anchor(
        "maxtext-32B_v5e-256",
        "v5e:16x16",
        "fsdp:256",
        4 * 256,
        2048,
        SCALE_32,
        "full",
        0.6686,
        f"{MAXTEXT} configs/v5e/README.md, 32b.sh",
        RELU,
    ),
    Anchor(
        "maxtext-32B_v5p-128",
        "v5p:4x4x4",
        "fsdp:16,tensor:4",
        8 * 64,
        2048,
        SCALE_32,
        "full",
        0.7147,
        f"{MAXTEXT} configs/v5p/README.md, 32b.sh",
        RELU + "; remat full where MaxText's minimal keeps the matmul outputs (our `dots`, which keeps them "
        "all, needs 155 GiB of temporaries here)",
    ),
    Anchor(
        "mixtral-8x7B_v6e-256",
        "v6e:16x16",
        "fsdp:256",
        12 * 256,
        4096,
        MIXTRAL_8X7B,
        "full",
        0.3523,
        f"{MAXTEXT} docs/reference/models/tiering.md; benchmarks mixtral_8x7b_dropped",
        CUSTOM + "; our experts are relu² MLPs (Mixtral's SwiGLU: 2/3 of its expert FLOPs) under a sigmoid "
        "top-2 router; capacity 1.25 per row (`moe_capacity_groups=row`) as theirs",
    ),
    Anchor(
        "llama3.1-8B_v6e-256",
        "v6e:16x16",
        "fsdp:256",
        4 * 256,
        8192,
        LLAMA31_8B,
        "full",
        0.4546,
        f"{MAXTEXT} docs/reference/models/tiering.md; benchmarks llama3_1_8b_8192",
        CUSTOM,
    ),
)


def maxtext_flops(model: dict, seq_len: int) -> float:
    """Training FLOPs per token as MaxText counts them for MFU (calculate_tflops_training_per_device, before
    it halved causal attention; every anchor here predates that): 3 x the forward's weight matmuls
    (q/k/v/o, the MLP's matrices, a MoE's top-k experts and its router, the logits) and 3 x full
    (non-causal) attention, 4 x seq x heads x head_dim per layer."""
    d, heads, kv, hd, f = (
        model[k] for k in ("hidden_size", "num_heads", "num_kv_heads", "head_dim", "mlp_dim")
    )
    matrices = 2 if model.get("mlp") == "relu2" else 3
    mlp = 2 * d * f * matrices
    if model.get("mlp") == "moe":
        mlp = mlp * model["moe_top_k"] + 2 * d * model["moe_experts"]
    layer = 2 * d * (heads + 2 * kv) * hd + 2 * heads * hd * d + mlp
    weights = model["num_layers"] * layer + 2 * d * model["vocab_size"]
    attention = model["num_layers"] * 4 * seq_len * heads * hd
    return 3 * (weights + attention)


def calibration_rows() -> list[Row]:
    # a MoE backbone keeps routing state: the LRT architecture without feedback is that plain backbone
    moe = ("--config.lrt.feedback=none",)
    return [
        Row(
            a.name,
            "configs/smollm1b_t2mlr.py",
            "lrt" if a.model.get("mlp") == "moe" else "transformer",
            a.topology,
            a.mesh,
            a.batch,
            a.seq_len,
            "train",
            (
                *NO_ACC,
                *(moe if a.model.get("mlp") == "moe" else ()),
                "--config.baseline.param_match=False",
                "--config.model.scan_layers=True",
                f"--config.model.remat={a.remat}",
                *(f"--config.model.{k}={v}" for k, v in a.model.items()),
            ),
        )
        for a in ANCHORS
    ]


STUDIES = {"pods": pod_rows, "coverage": coverage_rows, "calibration": calibration_rows}


def command(row: Row, out: Path) -> list[str]:
    return [
        sys.executable,
        str(TOOL),
        f"--config={row.config}",
        f"--arch={row.arch}",
        f"--topology={row.topology}",
        f"--mesh={row.mesh}",
        f"--batch={row.batch}",
        f"--seq_len={row.seq_len}",
        f"--programs={row.programs}",
        f"--out={out / row.name}",
        f"--config.mesh.zero={row.zero}",
        *row.overrides,
    ]


def run_row(row: Row, out: Path, force: bool) -> dict:
    """The row's aot.json (compiled now unless it exists), or its failure's last error line."""
    done = out / row.name / "aot.json"
    if force or not done.exists():
        ran = subprocess.run(command(row, out), cwd=ROOT, capture_output=True, text=True)
        (out / row.name).mkdir(parents=True, exist_ok=True)
        (out / row.name / "stderr.txt").write_text(ran.stderr)
        if not done.exists():
            errors = [line for line in ran.stderr.splitlines() if line.startswith("error:")]
            return {"row": row._asdict(), "error": errors[-1] if errors else ran.stderr[-500:]}
    return {"row": row._asdict(), **reported(json.loads(done.read_text()), out / row.name)}


def reported(result: dict, folder: Path) -> dict:
    """The row's programs reported again from their kept HLO by the current analysis (hlo_report): a
    change to the analysis needs no recompile."""
    for p in result["programs"]:
        if "roofline" not in p:
            continue
        if "device_coords" not in p:
            raise ValueError(f"{folder / 'aot.json'} predates the link and HBM counts: rerun with --force")
        with gzip.open(folder / "hlo" / f"{p['arch']}_{p['program']}.hlo.gz", "rt") as f:
            hlo = f.read()
        cost = {"flops": p["cost"]["xla_flops"], "bytes_accessed": p["cost"]["xla_bytes_accessed"]}
        p.update(
            hlo_report(
                hlo,
                p["memory"],
                cost,
                p["device_kind"],
                p["devices"],
                p["devices_per_chip"],
                p["roofline"]["model_flops"],
                p["device_coords"],
                p["memory"]["available_hbm_bytes"],
            )
        )
    return result


def _mesh(setting: dict) -> str:
    axes = ",".join(f"{k}:{v}" for k, v in setting["mesh"].items() if v > 1)
    return f"{axes} ZeRO-{setting['zero']}" if "zero" in setting else axes


# Median measured / estimated step of the calibration anchors (`--study=calibration`, docs/tpu_compile.md):
# the roofline's MFU over it is the calibrated estimate the README quotes.
CALIBRATION = 1.36


def _mfu(line: dict) -> str:
    if line["mfu"] is None:
        return "—"
    return f"{100 * line['mfu']:.0f}% ({100 * line['mfu'] / CALIBRATION:.0f}%)"


def _asked_gib(p: dict) -> float | None:
    """The GiB of temporaries a program libtpu refused for its size asked for; None for any other."""
    return p["memory"]["temp_bytes"] / 2**30 if "roofline" not in p and "memory" in p else None


def _refused(p: dict) -> str | None:
    """A program libtpu refused for its size, as two table cells; None for any other."""
    return None if _asked_gib(p) is None else f"> {_asked_gib(p):.0f} (temporaries) | **no**"


def table(results: list[dict]) -> str:
    """One line per (row, arch, program): the row's pod and mesh, per-device memory, the estimate."""
    lines = [
        "| row | arch | program | chips | mesh | GiB / device | fits | est. step ms | bound | "
        "MFU (calibrated) | collectives (count) | kernels |",
        "|---" * 12 + "|",
    ]
    for result in results:
        row = result["row"]
        if "error" in result:
            lines.append(
                f"| {row['name']} | {row['arch']} | — | {row['topology']} | {row['mesh']} | "
                f"**failed**: {result['error']} |||||||"
            )
            continue
        setting = result["setting"]
        mesh = _mesh(setting)
        for p in result["programs"]:
            chips = f"{setting['chips']} × {setting['chip']}"
            where = f"| {row['name']} | {p['arch']} | {p['program']} | {chips} | {mesh}"
            if "roofline" not in p:  # failed, none such, or refused by the compiler for its size
                if _refused(p):
                    lines.append(f"{where} | {_refused(p)} |||||")
                else:
                    lines.append(f"{where} | {p.get('skipped') or '**failed**: ' + p['error'][:200]} ||||||")
                continue
            memory, line = p["memory"], p["roofline"]
            collectives = ", ".join(f"{k} {v['count']}" for k, v in p["collectives"].items() if v["count"])
            lines.append(
                f"{where} | {memory['total_bytes'] / 2**30:.2f} | {'yes' if memory['fits'] else '**no**'} | "
                f"{1e3 * line['step_s']:.3g} | {line['bound']} | "
                f"{_mfu(line)} | {collectives or '—'} | "
                f"{sum(p.get('kernels', {}).values())} |"
            )
    return "\n".join(lines) + "\n"


def train_table(results: list[dict]) -> str:
    """The README's table: one line per (row, arch) train step, with its pod, mesh, per-chip memory
    against HBM, the estimate and the collectives per step."""
    lines = [
        "| row | arch | mesh | GiB / chip (available) | fits | est. step (bound) | MFU (calibrated) | "
        "collectives per step |",
        "|---" * 8 + "|",
    ]
    for result in results:
        row = result["row"]
        for p in result.get("programs", []):
            if p["program"] != "train":
                continue
            where = f"| {row['name']} | {p['arch']} | {_mesh(result['setting'])}"
            if "roofline" not in p:
                lines.append(f"{where} | {_refused(p) or '**failed**: ' + p.get('error', '')[:120]} ||||")
                continue
            memory, line = p["memory"], p["roofline"]
            gib = f"{memory['total_bytes'] / 2**30:.1f} / {memory['available_hbm_bytes'] / 2**30:.2f}"
            collectives = ", ".join(f"{v['count']} {k}" for k, v in p["collectives"].items() if v["count"])
            lines.append(
                f"{where} | {gib} | {'yes' if memory['fits'] else '**no**'} | "
                f"{1e3 * line['step_s']:.0f} ms ({line['bound']}) | {_mfu(line)} | {collectives or '—'} |"
            )
        if "error" in result:
            lines.append(
                f"| {row['name']} | {row['arch']} | {row['mesh']} | **failed**: {result['error']} ||||"
            )
    return "\n".join(lines) + "\n" if len(lines) > 2 else ""


def per_chip_table(results: list[dict]) -> str:
    """The train steps of a recipe compiled at several rows per chip (`NAME` at its plan's, `NAME_xN` at N),
    one line per (recipe, arch): per-chip memory and the estimate (calibrated MFU) at each."""
    cells: dict[tuple[str, str], dict[int, str]] = {}
    for result in results:
        name = result["row"]["name"].partition("_x")[0]
        for p in result.get("programs", []):
            if p["program"] != "train":
                continue
            if "roofline" not in p:
                asked = _asked_gib(p)
                cell = "**failed**" if asked is None else f"**does not fit**: {asked:.0f} GiB"
            else:
                line, gib = p["roofline"], p["memory"]["total_bytes"] / 2**30
                fits = "" if p["memory"]["fits"] else " **does not fit**"
                cell = f"{gib:.1f} GiB{fits}, {1e3 * line['step_s']:.0f} ms {line['bound']}, {_mfu(line)}"
            per_chip = result["setting"]["batch"] // result["setting"]["chips"]
            cells.setdefault((name, p["arch"]), {})[per_chip] = cell
    if not any(len(row) > 1 for row in cells.values()):
        return ""
    counts = sorted({n for row in cells.values() for n in row})
    header = " | ".join(f"{n} row{'s' if n > 1 else ''} per chip" for n in counts)
    lines = [f"| row | arch | {header} |", "|---" * (2 + len(counts)) + "|"]
    for (name, arch), row in cells.items():
        lines.append(f"| {name} | {arch} | " + " | ".join(row.get(n, "—") for n in counts) + " |")
    return "\n".join(lines) + "\n"


def train_ratios(results: list[dict]) -> str:
    """Per row compiling T²MLR beside the transformer: the estimated train-step time ratio beside the
    counted FLOP ratio (each architecture's `train_flops`)."""
    lines = [
        "| row | T²MLR / transformer: est. step | counted FLOPs | T²MLR bound | transformer bound |",
        "|---|---|---|---|---|",
    ]
    for result in results:
        train = {
            p["arch"]: p for p in result.get("programs", []) if p["program"] == "train" and "roofline" in p
        }
        if {"t2mlr", "transformer"} <= set(train):
            t2, tf = train["t2mlr"]["roofline"], train["transformer"]["roofline"]
            lines.append(
                f"| {result['row']['name']} | {t2['step_s'] / tf['step_s']:.2f}× | "
                f"{t2['model_flops'] / tf['model_flops']:.2f}× | {t2['bound']} | {tf['bound']} |"
            )
    return "\n".join(lines) + "\n" if len(lines) > 2 else ""


def shapes(a: Anchor) -> str:
    m = a.model
    heads = f"{m['num_heads']} x {m['head_dim']} heads" + (
        " (MHA)" if m["num_kv_heads"] == m["num_heads"] else f", {m['num_kv_heads']} kv"
    )
    mlp = f"{m.get('mlp', 'swiglu')} {m['mlp_dim']}"
    if m.get("mlp") == "moe":
        mlp = f"{m['moe_experts']} relu2 experts {m['mlp_dim']}, top {m['moe_top_k']}"
    vocab = f"vocab {m['vocab_size']}" + (" tied" if m["tie_embeddings"] else "")
    return (
        f"{m['num_layers']} x {m['hidden_size']}, {heads}, {mlp}, {vocab}; {a.batch} x {a.seq_len} tokens, "
        f"{a.mesh}, remat {a.remat}"
    )


def _estimates(results: list[dict]) -> list[tuple[Anchor, dict | str, float, float]]:
    """Per anchor: (anchor, its compiled train step or why there is none, roofline MFU, serial-bound
    MFU), both on MaxText's FLOP count."""
    anchors, found = {a.name: a for a in ANCHORS}, []
    for result in results:
        a = anchors[result["row"]["name"]]
        programs = [p for p in result.get("programs", []) if p["program"] == "train"]
        train = [p for p in programs if "roofline" in p]
        if not train:
            asked = _asked_gib(programs[0]) if programs else None
            why = (
                f"**not compiled**: {result.get('error', '')}"
                if asked is None
                else f"**does not fit**: {asked:.0f} GiB of temporaries"
            )
            found.append((a, why, math.nan, math.nan))
            continue
        line, peak = train[0]["roofline"], chip_of(train[0]["device_kind"]).peak_flops
        flops = maxtext_flops(a.model, a.seq_len) * a.batch * a.seq_len / train[0]["devices"]
        serial = line["compute_s"] + line["memory_s"] + line["communication_s"]
        found.append((a, train[0], flops / (line["step_s"] * peak), flops / (serial * peak)))
    return found


def calibration_table(results: list[dict]) -> str:
    """Per anchor: the measured MFU beside our estimate of the same run, both on MaxText's FLOP count
    (`maxtext_flops`): the roofline (the largest of compute, memory and communication time: perfect
    overlap) and the serial bound (their sum: no overlap). The calibrated estimate divides the roofline's
    MFU by the median of measured / estimated step over the other anchors (leave-one-out: no anchor
    calibrates itself); differences are in MFU points."""
    found = _estimates(results)
    ratios = {a.name: estimate / a.mfu for a, train, estimate, _ in found if isinstance(train, dict)}
    lines = [
        "| anchor | measured MFU | roofline | difference | serial bound | measured / estimated step | "
        "calibrated | difference | fits | our shapes | differs from MaxText |",
        "|---" * 11 + "|",
    ]
    for a, train, estimate, serial in found:
        if not isinstance(train, dict):
            lines.append(f"| {a.name} | {100 * a.mfu:.1f}% | {train} ||||||| {shapes(a)} | {a.differs} |")
            continue
        others = [r for name, r in ratios.items() if name != a.name]
        calibrated = estimate / statistics.median(others) if others else math.nan
        lines.append(
            f"| {a.name} | {100 * a.mfu:.1f}% | {100 * estimate:.1f}% | {100 * (estimate - a.mfu):+.1f} | "
            f"{100 * serial:.1f}% | {ratios[a.name]:.2f} | {100 * calibrated:.1f}% | "
            f"{100 * (calibrated - a.mfu):+.1f} | {'yes' if train['memory']['fits'] else '**no**'} | "
            f"{shapes(a)} | {a.differs} |"
        )
    if ratios:
        lines.append(
            f"\nMedian measured / estimated step over the {len(ratios)} anchors: "
            f"{statistics.median(ratios.values()):.2f} (`CALIBRATION`)."
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--study", choices=sorted(STUDIES), default="coverage")
    parser.add_argument("--rows", default="", help="comma list of row names (default: every row)")
    parser.add_argument("--out", type=Path, help="output folder (default runs/tpu_<study>)")
    parser.add_argument("--jobs", type=int, default=1, help="rows compiled side by side")
    parser.add_argument("--force", action="store_true", help="recompile rows whose aot.json exists")
    args = parser.parse_args(argv)
    rows = STUDIES[args.study]()
    if args.rows:
        wanted = {name.strip() for name in args.rows.split(",") if name.strip()}
        unknown = wanted - {row.name for row in rows}
        if unknown:
            print(
                f"error: --rows: {sorted(unknown)} not in study {args.study}: {[r.name for r in rows]}",
                file=sys.stderr,
            )
            return 2
        rows = [row for row in rows if row.name in wanted]
    if args.jobs < 1:
        print(f"error: --jobs must be >= 1, got {args.jobs}", file=sys.stderr)
        return 2
    out = args.out or ROOT / "runs" / f"tpu_{args.study}"
    out.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(
            tqdm(pool.map(lambda r: run_row(r, out, args.force), rows), total=len(rows), unit="row")
        )
    (out / "scaling.json").write_text(json.dumps(results, indent=2))
    tables = (calibration_table(results),) if args.study == "calibration" else ()
    tables += (per_chip_table(results), train_table(results), train_ratios(results), table(results))
    markdown = "\n".join(filter(None, tables))
    (out / "scaling.md").write_text(f"# TPU {args.study}\n\n" + markdown)
    print(markdown)
    print(f"-> {out / 'scaling.json'}, {out / 'scaling.md'}")
    failed = [r for r in results if "error" in r or any("error" in p for p in r.get("programs", []))]
    return 1 if failed else 0


if __name__ == "__main__":
    cpu_runtime.tune()  # this process only waits on the tool's, which tune themselves
    sys.exit(main())
