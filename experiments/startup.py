"""Seconds from `python main.py` to its first step, from a cold and a warm compilation cache.
What it runs: t2mlr_jax/studies/benchmarks/startup.py (`python -m experiments.startup --help`)."""

import sys

from t2mlr_jax import cpu_runtime
from t2mlr_jax.studies.benchmarks.startup import main

if __name__ == "__main__":
    cpu_runtime.tune()
    main(sys.argv[1:])
