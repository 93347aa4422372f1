"""The rows of experiments/tpu_scaling.py's studies, each one tools/aot_compile.py run: pods (the SmolLM2
T²MLR recipes and the LRT's paper sizes at their planned ZeRO stage and rows per chip), coverage (every
architecture, tiny, on three topologies) and calibration (MaxText's measured runs at their shapes)."""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

from t2mlr_jax.architectures import Architecture, build_architecture
from t2mlr_jax.config.edit import config_module
from t2mlr_jax.config.sections import Experiment
from t2mlr_jax.experiment import resolve
from t2mlr_jax.parallel.chips import chip_of
from t2mlr_jax.parallel.mesh import parse_mesh
from t2mlr_jax.train import memory_plan


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


def maxtext_flops(model: dict, seq_len: int) -> int:
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
