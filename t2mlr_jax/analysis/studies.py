"""`STUDIES`: architecture name -> the study main.py's --mode=train runs instead of the trainer for an
architecture with nothing to train, a function (config, workdir) -> results. Each study registers itself
from its own module (t2mlr_jax.analysis imports them all)."""

from t2mlr_jax.registry import Registry

STUDIES = Registry("study")
