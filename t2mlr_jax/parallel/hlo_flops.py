"""Matmul FLOPs of a compiled program counted off its executed HLO instructions (t2mlr_jax/parallel/hlo.py),
every trip of a loop included: XLA's own cost analysis counts a while body once, so under a scan over
layers it reports about one layer's FLOPs.

A `dot` costs 2 x (result elements) x (its contracted lhs dimensions), and so does a cuBLAS GEMM (GPU's
custom calls `__cublas$gemm`, `__cublas$lt$matmul...`: the dimensions in its backend config, the result
the first array of its (result, workspace) tuple). A `convolution` (TPU writes its matmuls as
convolutions: `dim_labels=0bf_io0->0bf`) costs 2 x (result elements) x (lhs features /
feature_group_count) x (window taps that land on an input), and x (lhs batch / batch_group_count) when
batch groups are used. Pallas kernels (custom calls: splash attention, the MoE's grouped matmuls) are
counted apart, off their operand shapes (`kernel_flops`). Elementwise ops are not counted: these are the
FLOPs a matrix unit runs.
"""

from __future__ import annotations

import math
import re

import numpy as np

from t2mlr_jax.parallel.hlo import ARRAY, Executed, Instruction, dims


def count(rest: str, name: str) -> int:
    found = re.search(rf"\b{name}=(\d+)", rest)
    return int(found.group(1)) if found else 1


def window_taps(rest: str, lhs: list[int], out: list[int], lhs_labels: str, out_labels: str) -> float:
    """Window taps one output position of a convolution multiplies, averaged over positions and taken over
    its spatial dimensions: a tap on padding, or between the inputs of a dilated lhs, does no work (XLA's
    gradient convolutions pad a length-1 input by the whole window)."""
    window = re.search(r"\bwindow=\{([^}]*)\}", rest)
    fields = dict(field.split("=", 1) for field in window.group(1).split()) if window else {}
    taps = 1.0
    for label, n_in in zip(lhs_labels, lhs):
        if not label.isdigit():
            continue
        per_dim = {
            key: value.split("x")[int(label)] for key, value in fields.items() if key != "rhs_reversal"
        }
        low = int(per_dim.get("pad", "0_0").split("_")[0])
        lhs_dilation = int(per_dim.get("lhs_dilate", 1))
        n_out = out[out_labels.index(label)]
        positions = (
            np.arange(n_out)[:, None] * int(per_dim.get("stride", 1))
            + np.arange(int(per_dim.get("size", 1)))[None, :] * int(per_dim.get("rhs_dilate", 1))
            - low
        )
        valid = (positions >= 0) & (positions <= (n_in - 1) * lhs_dilation) & (positions % lhs_dilation == 0)
        taps *= float(valid.sum()) / n_out
    return taps


def is_matmul(instruction: Instruction) -> bool:
    return instruction.opcode in ("dot", "convolution") or (
        instruction.opcode == "custom-call" and 'custom_call_target="__cublas$' in instruction.rest
    )


def contraction(run: Executed) -> float:
    """Multiply-adds behind one element of a dot's, GEMM's or convolution's result."""
    instruction = run.instruction
    lhs = dims(run.computation.instructions[instruction.operands[0]].type)
    if instruction.opcode != "convolution":
        dot = re.search(r"\blhs_contracting_dims=\{([\d,]*)\}", instruction.rest)
        gemm = re.search(r'"lhs_contracting_dimensions":\[([^\]]*)\]', instruction.rest)
        contracted = re.findall(r"\d+", (dot or gemm).group(1))
        return float(math.prod(lhs[int(i)] for i in contracted))
    lhs_labels, _, out_labels = re.search(r"\bdim_labels=(\w+)_(\w+)->(\w+)", instruction.rest).groups()
    taps = window_taps(instruction.rest, lhs, dims(instruction.type), lhs_labels, out_labels)
    features = lhs[lhs_labels.index("f")] / count(instruction.rest, "feature_group_count")
    batch_groups = count(instruction.rest, "batch_group_count")
    batch = lhs[lhs_labels.index("b")] / batch_groups if batch_groups > 1 else 1
    return features * taps * batch


def matmul_flops(executed: list[Executed]) -> float:
    """FLOPs of every dot, GEMM and convolution one run of the program executes."""
    return sum(
        2.0 * math.prod(dims(run.instruction.type)) * contraction(run) * run.executions
        for run in executed
        if is_matmul(run.instruction)
    )


# Matmuls per (q block, kv block) of splash attention's kernels: forward s = q k^T, o = p v; the dq pass
# s, dp = do v^T, dq = ds k; the dkv pass s, dp, dv = p^T do, dk = ds^T q; a fused backward all five.
SPLASH_MATMULS = {"fwd": 2, "dq": 3, "dkv": 4, "bwd": 5}
SPLASH = re.compile(r"^splash_\w*?_(fwd|dq|dkv|bwd)(?:_|$)")


def causal_fraction(q_blocks: int, kv_blocks: int, q_len: int, kv_len: int) -> float:
    """The share of (q block, kv block) pairs a causal mask leaves for the kernel to compute (diagonal
    blocks whole: the matrix unit does them)."""
    q_block, kv_block = q_len / q_blocks, kv_len / kv_blocks
    kept = sum(min(kv_blocks, math.ceil((i + 1) * q_block / kv_block)) for i in range(q_blocks))
    return kept / (q_blocks * kv_blocks)


# Grouped matmuls (the dropless MoE's): megablox's gmm / tgmm Pallas kernels, named for their functions
# ("gmm.2", "tgmm"; in some programs with the transformations' names, "transpose_jvp_jit_tgmm___"), and
# libtpu's own kernel for ragged_dot ("ragged-dot-none"; its "ragged-dot-metadata" call multiplies nothing).
GROUPED = re.compile(r"(?:^|_)t?gmm(?:_|\.|$)|^ragged-dot-(?!metadata)")


def splash_flops(run: Executed, shapes: list[tuple[str, list[int]]]) -> float:
    """One splash kernel call: matmuls x 2 x rows x heads x q length x kv length x head width x the causal
    share of its block grid. Operands: the block mask [.., q blocks, kv blocks] first, then q [rows..,
    heads, q, d] and k [rows.., kv heads, kv, d] (rows: batch rows vmapped into the kernel's grid). Every
    attention here is causal (a sliding window computes fewer blocks: an upper bound there)."""
    grid = next((s for dtype, s in shapes if dtype.startswith(("s", "u")) and len(s) == 3), None)
    q, k = [s for dtype, s in shapes if dtype.startswith(("bf", "f")) and len(s) >= 3][:2]
    fraction = causal_fraction(grid[1], grid[2], q[-2], k[-2]) if grid else 1.0
    matmuls = SPLASH_MATMULS[SPLASH.match(run.instruction.name).group(1)]
    return matmuls * 2.0 * math.prod(q[:-1]) * k[-2] * q[-1] * fraction


def grouped_flops(run: Executed, shapes: list[tuple[str, list[int]]]) -> float:
    """One grouped-matmul kernel call: 2 x m x k x n, its lhs [m, k] the first float operand (after the
    integer group metadata) and n its result's last dimension: gmm [m, k] x [groups, k, n] -> [m, n] (its
    input gradient the same with k and n swapped), tgmm [m, k]^T x [m, n] -> [groups, k, n] (each row is in
    one group). m counts every row the kernel is given, the padding to its row tiles and the rows of no
    group included: an upper bound."""
    lhs = next(s for dtype, s in shapes if dtype.startswith(("bf", "f")))
    return 2.0 * math.prod(lhs) * dims(run.instruction.type)[-1]


def kernel_flops(executed: list[Executed]) -> float:
    """FLOPs of the Pallas kernels (custom calls, which XLA's cost and the matmul count do not see):
    splash attention's (`splash_flops`) and the grouped matmuls' (`grouped_flops`), each call times its
    executions."""
    total = 0.0
    for run in executed:
        instruction = run.instruction
        if instruction.opcode != "custom-call":
            continue
        if SPLASH.match(instruction.name):
            count = splash_flops
        elif GROUPED.search(instruction.name):
            count = grouped_flops
        else:
            continue
        types = [run.computation.instructions[name].type for name in instruction.operands]
        shapes = [(array.group(1), dims(t)) for t in types if (array := ARRAY.match(t))]  # not tuples
        total += count(run, shapes) * run.executions
    return total
