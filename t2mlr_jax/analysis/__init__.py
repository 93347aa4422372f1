"""Analyses of trained runs and models: the run report (tools/report.py), the multi-architecture comparison
(main.py), and the studies main.py runs for architectures with nothing to train (`STUDIES`). Above the
training layer: it may import t2mlr_jax.train and below; nothing else in t2mlr_jax imports it."""

from t2mlr_jax.analysis import recirculation_sweep  # noqa: F401  (registers its study)
from t2mlr_jax.analysis.studies import STUDIES

__all__ = ["STUDIES"]
