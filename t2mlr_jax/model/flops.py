"""Expected training FLOPs from the model's shapes (the depth-versus-time paper's Appendix C.1 accounting).

Matmuls cost 2 FLOPs per multiply-add over the parameters a token activates (an MoE layer: its router,
`moe_top_k` routed experts and the shared ones); attention 4 H E FLOPs per query-key pair it scores and
reads, causal (query i sees i + 1 keys, at most window + 1 on a sliding-window layer); the LM head
2 D V per position it scores. A backward costs 2 forwards. Embedding lookups, norms and elementwise ops
are free. Architectures compose `pass_flops` and `head_flops` into their `train_flops(seq_len)`.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.params import backbone_specs

BACKWARD = 2.0  # a backward pass's FLOPs per forward FLOP


def block_params(cfg: ModelConfig) -> float:
    """Matmul parameters one block applies to one token (MoE: active experts only)."""
    total = 0.0
    for spec in jax.tree.leaves(backbone_specs(cfg)["layers"], is_leaf=lambda x: hasattr(x, "kind")):
        if spec.kind not in ("matrix", "gate"):
            continue
        size = float(np.prod(spec.shape)) / cfg.num_layers
        total += size * cfg.moe_top_k / cfg.moe_experts if "experts" in spec.axes else size
    return total


def mean_keys(length: int, window: int | None) -> float:
    """Keys a query scores on average over a causal row of `length` positions."""
    seen = np.arange(1, length + 1)
    return float(np.minimum(seen, window + 1).mean() if window is not None else seen.mean())


def pass_flops(
    cfg: ModelConfig, length: int, *, layers: Sequence[int] | None = None, extra_params: float = 0.0
) -> float:
    """Forward FLOPs of one pass over a row of `length` positions through blocks `layers` (default: the
    stack once; a looped model lists its repeats), with `extra_params` more matmul parameters per
    position and block (e.g. the LRT's feedback projections)."""
    layers = range(cfg.num_layers) if layers is None else layers
    per_layer = 2.0 * length * (block_params(cfg) + extra_params)
    attention = sum(
        4.0 * length * mean_keys(length, cfg.layer_windows[i]) * cfg.num_heads * cfg.head_dim for i in layers
    )
    return len(layers) * per_layer + attention


def head_flops(cfg: ModelConfig, positions: int) -> float:
    """Forward FLOPs of the LM head at `positions` positions."""
    return 2.0 * positions * cfg.hidden_size * cfg.vocab_size


def one_pass_train_flops(cfg: ModelConfig, seq_len: int, layers: Sequence[int] | None = None) -> float:
    """Training FLOPs of a row through a model that runs blocks `layers` once per position and scores
    every position (the plain transformer; a looped one lists its repeats)."""
    return train(pass_flops(cfg, seq_len, layers=layers) + head_flops(cfg, seq_len))


def train(forward: float) -> float:
    """Forward plus backward."""
    return (1.0 + BACKWARD) * forward
