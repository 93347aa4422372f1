"""FLOPs of the benchmarked programs. Expected: the architectures' own count (t2mlr_jax/model/flops.py,
T²MLR's in t2mlr_jax/architectures/t2mlr/flops.py: causal attention, the Jacobi passes, the backward where
the gradient flows), the one the trainer logs and MFU divides. Measured: the dot_generals (and ragged_dots:
the dropless MoE's grouped matmuls) of the traced jaxpr, and XLA's cost analysis of the compiled program
(t2mlr_jax/parallel/hlo_flops.py counts the compiled HLO's instead, every loop trip included)."""

import numpy as np

from t2mlr_jax.architectures import build_architecture, flops_per_step
from t2mlr_jax.architectures.t2mlr import recurrent
from t2mlr_jax.architectures.t2mlr.flops import exact_forward_flops
from t2mlr_jax.config.sections import Experiment
from t2mlr_jax.model.config import ModelConfig


def expected_train_flops(cfg: ModelConfig, batch: int, seq: int, d_forward: int, d_backward: int) -> float:
    """Expected FLOPs of one train step of `batch` rows of `seq` tokens (harness.compile_jacobi_step):
    `flops_per_step` of the architecture the benchmark's model is, T²MLR at Jacobi D = d_forward,
    B = d_backward, or the plain transformer (as given: the benchmark has widened it already)."""
    if cfg.recurrence is not None:
        cfg = recurrent(cfg, d_forward=d_forward, d_backward=d_backward)
    config = Experiment(name="bench", model=cfg, arch="t2mlr" if cfg.recurrence else "transformer")
    config = config.replace(
        train={"batch_size": batch}, data={"seq_len": seq}, baseline={"param_match": False}
    )
    return flops_per_step(config, build_architecture(config))


def expected_decode_flops(cfg: ModelConfig, batch: int, prompt_len: int, new_tokens: int) -> float:
    """Expected FLOPs of one generate() of `new_tokens` after a `prompt_len`-token prompt: its exact prefill
    and decode steps run the row token by token, every position but the last token (which is not fed back)."""
    return batch * exact_forward_flops(cfg, prompt_len + new_tokens - 1)


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
