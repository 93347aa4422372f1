"""The learning-rate rule: one multiplier over a recipe's rates, swept on a study's baseline row.
What it runs: t2mlr_jax/studies/lr_sweep.py (`python -m experiments.lr_sweep --help`)."""

from t2mlr_jax import cpu_runtime
from t2mlr_jax.studies.lr_sweep import main

if __name__ == "__main__":
    cpu_runtime.tune()
    main()
