"""Expected training FLOPs from the model's shapes (the depth-versus-time paper's Appendix C.1 accounting).

Matmuls cost 2 FLOPs per multiply-add over the parameters a token activates (an MoE layer: its router,
`moe_top_k` routed experts and the shared ones); attention 4 H E FLOPs per query-key pair it scores and
reads, causal (query i sees i + 1 keys, at most window + 1 on a sliding-window layer); the LM head
2 D V per position it scores. A backward costs 2 forwards, and runs only where the gradient flows (a
stop_gradient'ed pass costs its forward only); through frozen weights it costs each matmul's input gradient
(1 forward) and attention's 2 (`input_gradient_flops`). Embedding lookups, norms and elementwise ops are
free. Counts are model FLOPs: work whose result nothing reads is left out. Architectures compose
`pass_flops` and `head_flops` into their `train_flops(seq_len)`
(T²MLR's: t2mlr_jax.architectures.t2mlr.flops).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.params import backbone_specs

BACKWARD = 2.0  # a backward pass's FLOPs per forward FLOP


def _leaves(specs: dict) -> list:
    return jax.tree.leaves(specs, is_leaf=lambda x: hasattr(x, "kind"))


def block_params(cfg: ModelConfig) -> float:
    """Matmul parameters one block applies to one token (MoE: active experts only)."""
    total = 0.0
    for spec in _leaves(backbone_specs(cfg)["layers"]):
        if spec.kind not in ("matrix", "gate"):
            continue
        size = float(np.prod(spec.shape)) / cfg.num_layers
        total += size * cfg.moe_top_k / cfg.moe_experts if "experts" in spec.axes else size
    return total


def matrix_params(specs: dict) -> float:
    """Matmul parameters of a table applied once per position: its "matrix" entries (T²MLR's mixer, the LSTM,
    the adaptive recirculation MLP); gammas, norms and biases are elementwise."""
    return float(sum(np.prod(spec.shape) for spec in _leaves(specs) if spec.kind == "matrix"))


def mean_keys(length: int, window: int | None) -> float:
    """Keys a query scores on average over a causal row of `length` positions."""
    seen = np.arange(1, length + 1)
    return float(np.minimum(seen, window + 1).mean() if window is not None else seen.mean())


def attention_flops(cfg: ModelConfig, length: int, layers: Sequence[int]) -> float:
    """Forward FLOPs of causal attention (scores and reads) over a row of `length` positions in `layers`."""
    return sum(
        4.0 * length * mean_keys(length, cfg.layer_windows[i]) * cfg.num_heads * cfg.head_dim for i in layers
    )


def pass_flops(
    cfg: ModelConfig, length: int, *, layers: Sequence[int] | None = None, extra_params: float = 0.0
) -> float:
    """Forward FLOPs of one pass over a row of `length` positions through blocks `layers` (default: the
    stack once; a looped model lists its repeats), with `extra_params` more matmul parameters per
    position and block (e.g. the LRT's feedback projections)."""
    layers = range(cfg.num_layers) if layers is None else layers
    per_layer = 2.0 * length * (block_params(cfg) + extra_params)
    return len(layers) * per_layer + attention_flops(cfg, length, layers)


def input_gradient_flops(cfg: ModelConfig, length: int, layers: Sequence[int]) -> float:
    """Backward FLOPs of a pass through frozen blocks `layers` that only hands the gradient to its input:
    each matmul's input gradient (one forward of it), attention's two forwards as ever."""
    return pass_flops(cfg, length, layers=layers) + attention_flops(cfg, length, layers)


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
