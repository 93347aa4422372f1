"""PonderLM-2: the LRT's thought slots with no cross-token feedback (architecture.py)."""

from t2mlr_jax.architectures.ponderlm2.architecture import PonderLM2Settings

__all__ = ["PonderLM2Settings"]
