"""Jacobi-trained versus exact-trained T²MLR (the T²MLR paper's Table 6).
What it runs: t2mlr_jax/studies/jacobi_vs_exact.py (`python -m experiments.jacobi_vs_exact --help`)."""

from t2mlr_jax import cpu_runtime
from t2mlr_jax.studies.jacobi_vs_exact import main

if __name__ == "__main__":
    cpu_runtime.tune()
    main()
