"""The ZeRO stage and rows per chip a training recipe takes on a pod, from an analytic estimate of what each
chip holds: no compile (experiments/tpu_scaling.py names its recipes by `plan`; their compiles check it).

Per chip: the training state as the ZeRO stage splits it (`state_bytes`) and the activations a row's
backward keeps (`activation_bytes_per_row`) times the rows per chip, against HEADROOM of the chip's HBM
(t2mlr_jax.parallel.chips). `plan` takes the most rows of ROWS_PER_CHIP that fit (4 where memory allows),
under ZeRO-1 (weights whole on every chip: no weight gathers in the layers) where the whole weights fit
beside them, else ZeRO-3: more rows per chip come before whole weights.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import jax.numpy as jnp

from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.parallel.chips import Chip
from t2mlr_jax.parallel.mesh import parse_mesh
from t2mlr_jax.parallel.rules import ZERO_STAGES

HEADROOM = 0.9  # of the chip's HBM planned for: libtpu's reserve, XLA's temporaries beyond the estimate
ROWS_PER_CHIP = (4, 2, 1)  # tried in turn: four 2048-token rows keep a chip's matrix units busy
WEIGHT_BYTES = 4  # fp32 master weights
GRADIENT_BYTES = 4  # fp32 gradients, split as the weights (whole under ZeRO-1 until reduce-scattered)
OPTIMIZER_BYTES = 8  # Adam's two fp32 moments (Muon keeps one for its matrices: less)
LOGIT_BYTES = 8  # fp32 logits and their gradient, per vocabulary entry


class Workload(NamedTuple):
    """What training one architecture costs a chip: its parameters, the bytes of an element in its compute
    dtype, and the activations one row keeps for the backward (`activation_bytes_per_row`)."""

    params: int
    compute_bytes: int
    row_bytes: float


def workload(
    model: ModelConfig,
    params: int,
    seq_len: int,
    layer_passes: int,
    logit_passes: int,
    mesh: dict[str, int],
) -> Workload:
    """The Workload of a model of `params` parameters training rows of `seq_len` tokens on a mesh of these
    sizes (`activation_bytes_per_row` for the passes)."""
    return Workload(
        params,
        jnp.dtype(model.dtype).itemsize,
        activation_bytes_per_row(model, seq_len, layer_passes, logit_passes, mesh),
    )


class Plan(NamedTuple):
    mesh: str
    zero: int  # mesh.zero
    rows_per_chip: int


def state_bytes(work: Workload, mesh: dict[str, int], zero: int) -> float:
    """One chip's share of the training state under ZeRO stage `zero` (rules.ZERO_STAGES): fp32 weights and
    gradients split over the stage's weight axes, the optimizer state over its state axes, and the weights
    once more in the compute dtype (gathered under ZeRO-3, cast under ZeRO-1: at worst all at once). The
    tensor and expert axes are left out: they only split more."""
    stage = ZERO_STAGES[zero]
    split = lambda axes: math.prod(mesh[a] for a in axes)
    per_param = (
        (WEIGHT_BYTES + GRADIENT_BYTES) / split(stage.weights)
        + OPTIMIZER_BYTES / split(stage.optimizer_state)
        + work.compute_bytes
    )
    return work.params * per_param


def activation_bytes_per_row(
    model: ModelConfig, seq_len: int, layer_passes: int, logit_passes: int, mesh: dict[str, int]
) -> float:
    """What one training row's backward keeps, for `layer_passes` differentiated passes over a layer (a
    transformer: num_layers) and `logit_passes` logits the loss reads. Per layer pass and token, in the
    compute dtype, assuming:
    - remat "dots" keeps the matmul outputs: q, k, v, the attention output, o_proj, the MLP's two hidden
      projections and its output, and the block's input; "none" also the norms' outputs and the MLP's
      activation; "full" only the block's input;
    - attention keeps no [T, T] scores (a flash / splash kernel);
    - a MoE's hidden is its dispatch slots' and its shared experts', each slot moves its token in and out
      and the combine sums in fp32: dropless (grouped), top-k slots per token of the expert peers' rows it
      gathers (mesh.expert per row of its own); with a capacity factor, capacity x top-k per token of its
      own rows (capacity per row) or of the whole call (per call: data x fsdp rows per row of its own);
    - the loss keeps fp32 logits and their gradient per logits pass.
    Against the compiled pods (docs/tpu_compile.md, ZeRO-3, GiB per row added): SmolLM2-135M T²MLR (13,18)
    on v5e-256 1.9 estimated, 2.2 compiled; its transformer 1.5, 1.2; 1B T²MLR 6.2, 5.5; LRT-d16 (remat
    none, dropless) on v5p-64 under ZeRO-1, in all: expert:8 at one row 60.2 estimated, 47.25 compiled;
    fsdp:64 at four rows 56.7, 71.1."""
    d = model.hidden_size
    block = 3 * d + 2 * (model.num_heads + model.num_kv_heads) * model.head_dim
    hidden, moved = model.mlp_dim, 0.0
    if model.mlp == "moe":
        if model.moe_capacity_factor is None:  # grouped: a device runs its expert peers' tokens too
            rows, slots = mesh["expert"], model.moe_top_k * mesh["expert"]
        else:
            rows = mesh["data"] * mesh["fsdp"] if model.moe_capacity_groups == "call" else 1
            slots = model.moe_capacity_factor * model.moe_top_k * rows
        # each slot's token in and out, and the combine's fp32 sums (per slot and per token)
        combine = 4 / jnp.dtype(model.dtype).itemsize * d * (slots + rows)
        hidden, moved = (slots + model.moe_shared) * model.expert_dim, 2 * d * slots + combine
    dots = block + 2 * hidden + moved
    kept = {"full": d, "dots": dots, "none": dots + 2 * d + hidden}[model.remat]
    layers = layer_passes * seq_len * kept * jnp.dtype(model.dtype).itemsize
    return layers + logit_passes * seq_len * model.vocab_size * LOGIT_BYTES


def plan(works: Sequence[Workload], chip: Chip, mesh: str) -> Plan:
    """The most rows per chip (ROWS_PER_CHIP) at which every workload fits HEADROOM of the chip's HBM on
    `mesh`, under ZeRO-1 if the whole weights fit beside them, else ZeRO-3; nothing fits: ZeRO-3 at one row
    (the least a chip holds; its compile says by how much)."""
    sizes, budget = parse_mesh(mesh), HEADROOM * chip.hbm_bytes
    for rows in ROWS_PER_CHIP:
        for zero in (1, 3):
            if all(state_bytes(w, sizes, zero) + rows * w.row_bytes <= budget for w in works):
                return Plan(mesh, zero, rows)
    return Plan(mesh, 3, 1)
