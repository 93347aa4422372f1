"""The GPU check: what a GPU is needed for, measured in one run on one H100 / H200.
What it runs: t2mlr_jax/studies/benchmarks/gpu_check.py (`python -m experiments.gpu_check --help`)."""

from t2mlr_jax import cpu_runtime
from t2mlr_jax.studies.benchmarks.gpu_check import main

if __name__ == "__main__":
    cpu_runtime.tune()  # a no-op on a GPU host; its CPU dry run is tuned as every program of ours
    main()
