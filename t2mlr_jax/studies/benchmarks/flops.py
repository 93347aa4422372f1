"""FLOP counts of the benchmarked programs, three ways: a formula over the model shapes, the dot_generals (and
ragged_dots: the dropless MoE's grouped matmuls) of the traced jaxpr, and XLA's cost analysis of the
compiled program.

The formula counts matmuls only, attention dense (the masked T x S scores are computed in full, no causal
halving), embedding lookups free.
"""

import jax
import numpy as np

from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.studies.benchmarks.presets import param_shapes


def layer_matmul_params(cfg: ModelConfig) -> int:
    d, attn, kv = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    return 2 * d * attn + 2 * d * kv + 3 * d * cfg.mlp_dim


def mixer_matmul_params(cfg: ModelConfig) -> int:
    if cfg.recurrence is None:
        return 0
    return sum(x.size for x in jax.tree.leaves(param_shapes(cfg)["mixer"]) if x.ndim == 2)


def forward_flops(
    cfg: ModelConfig, batch: int, queries: int, keys: int, layer_passes: int, fusions: int
) -> float:
    """`layer_passes` blocks and `fusions` fusion modules over `queries` tokens attending to `keys`,
    plus the head."""
    per_layer = 2 * queries * layer_matmul_params(cfg) + 4 * queries * keys * cfg.num_heads * cfg.head_dim
    fusion = 2 * queries * mixer_matmul_params(cfg)
    head = 2 * queries * cfg.hidden_size * cfg.vocab_size
    return float(batch * (layer_passes * per_layer + fusions * fusion + head))


def train_flops(cfg: ModelConfig, batch: int, seq: int, d_forward: int, d_backward: int) -> float:
    """One step: the forward, plus a backward of 2x forward for the passes that carry gradient.

    Jacobi forward: blocks [0, l_end] unfused, D-1 middle-block refinements, blocks [l_start, L) once more:
    L + D*M block passes (M = middle-block size) and D fusions. Gradient reaches blocks below l_start,
    the final pass and the last min(B, D-1) refinements; the unfused middle pass only when B >= D.
    """
    layers = cfg.num_layers
    if cfg.recurrence is None:
        return 3 * forward_flops(cfg, batch, seq, seq, layers, 0)
    l_start, l_end = cfg.layer_range
    middle = l_end - l_start + 1
    n_grad = min(d_backward, d_forward - 1)
    forward = forward_flops(cfg, batch, seq, seq, layers + d_forward * middle, d_forward)
    grad_passes = layers + n_grad * middle + (middle if d_backward >= d_forward else 0)
    return forward + 2 * forward_flops(cfg, batch, seq, seq, grad_passes, n_grad + 1)


def decode_flops(cfg: ModelConfig, batch: int, prompt_len: int, new_tokens: int) -> float:
    """The decode steps (prefill of the short prompt left out); every step attends to all cache slots."""
    fusions = 0 if cfg.recurrence is None else 1
    return new_tokens * forward_flops(cfg, batch, 1, prompt_len + new_tokens, cfg.num_layers, fusions)


def _sub_jaxprs(value):
    if hasattr(value, "eqns"):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _sub_jaxprs(item)


def _matmul_flops(eqn) -> float:
    """2 x the multiply-adds of a dot_general or ragged_dot_general: lhs elements x the rhs elements that
    are neither contracted, nor batch, nor a group (a ragged_dot multiplies each row by one group's
    matrix: 2 m k n for [m, k] x [groups, k, n]; its transposes, the ragged contracting form of its weight
    gradient included, alike). 0 for a product with a vector: a sum written as one (`layers._sum_last`, the
    norm and softmax gradients on a CPU), not a matmul of the model."""
    shapes = [v.aval.shape for v in eqn.invars[:2]]
    if eqn.primitive.name == "dot_general":
        numbers, groups = eqn.params["dimension_numbers"], ()
    elif eqn.primitive.name == "ragged_dot_general":
        ragged = eqn.params["ragged_dot_dimension_numbers"]
        numbers, groups = ragged.dot_dimension_numbers, ragged.rhs_group_dimensions
    else:
        return 0.0
    if min(map(len, shapes)) < 2:
        return 0.0
    lhs, rhs = shapes
    (_, rhs_contract), (_, rhs_batch) = numbers
    shared = np.prod([rhs[i] for i in (*rhs_contract, *rhs_batch, *groups)])
    return 2.0 * np.prod(lhs) * np.prod(rhs) / shared


def jaxpr_matmul_flops(jaxpr) -> float:
    """dot_general and ragged_dot_general FLOPs of a jaxpr as traced (`_matmul_flops`), scan bodies times
    their length (what XLA's cost analysis cannot do: it counts a loop body once)."""
    total = 0.0
    for eqn in jaxpr.eqns:
        total += _matmul_flops(eqn)
        inner = [jaxpr_matmul_flops(j) for value in eqn.params.values() for j in _sub_jaxprs(value)]
        if eqn.primitive.name == "cond":
            total += max(inner, default=0.0)
        else:
            total += sum(inner) * eqn.params.get("length", 1)
    return float(total)


def xla_flops(compiled) -> float | None:
    analysis = compiled.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
    return None if not analysis or "flops" not in analysis else float(analysis["flops"])
