"""Convergence-adaptive Jacobi against fixed depths on a trained T²MLR checkpoint (issue 13).
What it runs: t2mlr_jax/studies/adaptive_jacobi.py (`python -m experiments.adaptive_jacobi --help`)."""

from t2mlr_jax import cpu_runtime
from t2mlr_jax.studies.adaptive_jacobi import main

if __name__ == "__main__":
    cpu_runtime.tune()
    main()
