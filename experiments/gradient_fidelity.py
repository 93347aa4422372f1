"""Gradient fidelity of the Jacobi forward (the T²MLR paper's Fig. 7).
What it runs: t2mlr_jax/studies/gradient_fidelity.py (`python -m experiments.gradient_fidelity --help`)."""

from t2mlr_jax import cpu_runtime
from t2mlr_jax.studies.gradient_fidelity import main

if __name__ == "__main__":
    cpu_runtime.tune()
    main()
