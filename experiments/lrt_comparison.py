"""Depth versus time: the LRT comparison's rows trained per seed and tabulated as the paper's.
What it runs: t2mlr_jax/studies/lrt_comparison.py (`python -m experiments.lrt_comparison --help`)."""

from t2mlr_jax import cpu_runtime
from t2mlr_jax.studies.lrt_comparison import main

if __name__ == "__main__":
    cpu_runtime.tune()
    main()
