"""`STUDIES`: architecture name -> the study main.py's --mode=train runs instead of the trainer for an
architecture with nothing to train, a function (config, workdir) -> results: recirculation's sweep."""

from t2mlr_jax.registry import Registry
from t2mlr_jax.studies.recirculation_sweep import run_sweep

STUDIES = Registry("study")
STUDIES.register("recirculation", run_sweep)
