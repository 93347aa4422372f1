"""T²MLR and the plain transformer it must equal at γ = 0 (architecture.py). The temporal recurrence itself
(the Jacobi loop, the fusion, the mixers) is model-level code every backbone-based system shares:
t2mlr_jax.model.recurrence, .fusion and .mixers. Other systems use only what this file exports."""

from t2mlr_jax.architectures.t2mlr.architecture import (
    Depth,
    T2MLRSettings,
    backbone_architecture,
    baseline_backbone,
    stateless,
)

__all__ = ["Depth", "T2MLRSettings", "backbone_architecture", "baseline_backbone", "stateless"]
