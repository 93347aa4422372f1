"""The LRT against its vanilla backbone (experiments/bench_lrt.py): decode time per token (the paper's
Table 1 "decode latency" column: 1.1x for the LRT at 1x depth), the real train step's time for
P = 1..4 refinement passes next to its counted FLOPs, and the decode time per vocabulary token of every
row of Table 1 (configs/lrt_comparison.py) over the 1x vanilla transformer, next to the paper's column.

The decode and train models are the `lrt` architecture built from configs/lrt_nanochat.py (the paper's
recipe: nanochat MoE backbone, MuonAdamW) on the preset's backbone; the vanilla one is
`lrt.feedback="none"`, which is exactly the plain backbone through the same code path (one pass, no
feedback parameters). The rows are each built by its own architecture (lrt, looped, ponderlm2).

This module: the presets and what the sections share; the sections are lrt_decode.py, lrt_train.py and
lrt_rows.py.
"""

from __future__ import annotations

import dataclasses

import jax
import ml_collections

from configs.recipes import backbone_preset
from t2mlr_jax.architectures import build_architecture
from t2mlr_jax.architectures.lrt import architecture as lrt
from t2mlr_jax.config.edit import config_module, set_path
from t2mlr_jax.experiment import resolve
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.presets import nanochat
from t2mlr_jax.model.spec import count_specs
from t2mlr_jax.studies import ROOT
from t2mlr_jax.studies.benchmarks.report import describe

CONFIG = ROOT / "configs" / "lrt_nanochat.py"
COMPARISON = CONFIG.with_name("lrt_comparison.py")  # every row of the paper's comparison
PAPER_DECODE_RATIO = 1.1  # Table 1, LRT at 1x depth: mean of the 16L and 20L latencies over vanilla
# Table 1's decode latency of each row over the 1x transformer (its 16L / 20L mean), the rows' order.
PAPER_ROW_RATIOS = {
    "vanilla1x": 1.0,
    "vanilla2x": 2.0,
    "vanilla3x": 3.0,
    "loop2": 2.0,
    "loop3": 3.0,
    "loop4": 3.9,
    "lrt1x": 1.1,
    "lrt2x": 2.2,
    "lrt3x": 3.3,
    "tt1": 2.3,
    "tt2": 3.4,
    "ponder1": 2.1,
    "ponder2": 3.1,
}
TABLE1_ROWS = tuple(PAPER_ROW_RATIOS)
BASELINE_ROW = "vanilla1x"  # every row's ratio is over it
VANILLA, LRT = "vanilla", "LRT"
# LLVM unoptimised: an initialisation compiles in ~1 s on a CPU instead of ~10 s.
FAST_COMPILE = (("xla_backend_optimization_level", 0),)


@dataclasses.dataclass(frozen=True)
class LRTPreset:
    model: ModelConfig  # the backbone both models share
    repeats: int
    decode_batch: int
    prompt_len: int
    new_tokens: int
    train_batch: int  # rows per step
    train_seq: int
    grad_accum: int = 1
    passes: tuple[int, ...] = lrt.PASSES  # the paper's refinement passes P ...
    pass_probs: tuple[float, ...] = lrt.PASS_PROBS  # ... and their training probabilities: E[P] = 2.0
    paper_shapes: bool = False  # the paper's own backbone and protocol: show its figure beside ours
    # XLA options of the timed programs; the test preset compiles unoptimised (its timings mean nothing).
    compiler_options: tuple[tuple[str, object], ...] = ()
    # The rows section: rows of configs/lrt_comparison.py (vanilla1x, the baseline, always), built at
    # its scale `rows_scale` (cpu | paper) on this backbone; each generates rows_new_tokens from a
    # one-token prompt (None: prompt_len + new_tokens, the decode section's context).
    rows: tuple[str, ...] = TABLE1_ROWS
    rows_scale: str = "cpu"
    rows_new_tokens: int | None = None


PRESETS = {
    # Test-sized: seconds, compile-bound.
    "test": LRTPreset(
        model=nanochat(
            2,
            seq_len=32,
            width=32,
            head_dim=16,
            vocab_size=64,
            moe_experts=4,
            gate_channels=8,
            dtype="float32",
        ),
        repeats=1,
        decode_batch=2,
        prompt_len=4,
        new_tokens=4,
        train_batch=2,
        train_seq=16,
        # One LRT step (pass 0 + 1 refinement) beside vanilla: each compile is ~5-10 s on a busy CPU.
        passes=(1,),
        pass_probs=(1.0,),
        compiler_options=FAST_COMPILE,
        # One row of each decoding kind: plain, feedback, thought slots with and without feedback, looped.
        rows=("vanilla1x", "lrt1x", "tt1", "ponder1", "loop2"),
    ),
    # CPU-sized nanochat (4 layers, d 128, MoE 8+1 experts, vocab 4096), fp32; 1/16 of the paper's prompt,
    # 1/8 of its new tokens, and many short rounds: a shared CPU's noise comes in bursts of seconds.
    "quick": LRTPreset(
        model=nanochat(4, seq_len=256, width=128, head_dim=64, vocab_size=4096, dtype="float32"),
        repeats=10,
        decode_batch=8,
        prompt_len=64,
        new_tokens=128,
        train_batch=8,
        train_seq=128,
        # 13 rows, ~40x vanilla's decode work per round: short generations (the run: a few minutes).
        rows_new_tokens=32,
    ),
    # The paper's 16-layer reference (0.80B, bf16 compute; fp32 master weights for training, bf16 weights
    # for serving) and its latency protocol: batch 128, 1024 prompt + 1024 generated tokens.
    "full": LRTPreset(
        model=nanochat(16, seq_len=2048),
        repeats=3,
        decode_batch=128,
        prompt_len=1024,
        new_tokens=1024,
        train_batch=16,
        train_seq=2048,
        grad_accum=2,
        paper_shapes=True,
        rows_scale="paper",
    ),
}


def load_config(model: ModelConfig, feedback: str, p: LRTPreset) -> ml_collections.ConfigDict:
    """configs/lrt_nanochat.py (the paper's recipe) on `model`, with `feedback` and the preset's step."""
    config = config_module(CONFIG).get_config()
    for path, value in backbone_preset(model).items():
        set_path(config, path, value)
    config.lrt.feedback = feedback
    config.lrt.passes, config.lrt.pass_probs = tuple(p.passes), tuple(p.pass_probs)
    config.data.seq_len = p.train_seq
    config.train.batch_size, config.train.grad_accum = p.train_batch, p.grad_accum
    config.optimizer.muon.batch_tokens = p.train_batch * p.train_seq
    return config


def describe_models(p: LRTPreset) -> dict:
    specs = {
        f: build_architecture(resolve(load_config(p.model, f, p)), "lrt").specs for f in ("both", "none")
    }
    return {
        "backbone": describe(p.model),
        "lrt_params": count_specs(specs["both"]),
        "vanilla_params": count_specs(specs["none"]),
    }


def untimed(fn):
    """fn() jitted; compiled unoptimised on CPUs, where optimising an initialisation takes ~10 s."""
    options = dict(FAST_COMPILE) if jax.default_backend() == "cpu" else None
    return jax.jit(fn).lower().compile(options)()
