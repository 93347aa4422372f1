"""Our side of `experiments/vs_release.py --release ponderlm2`, in a process of its own.
What it runs: t2mlr_jax/studies/benchmarks/vs_ponderlm2_ours.py (python -m
experiments.benchmarks.vs_ponderlm2_ours '<spec json>')."""

from t2mlr_jax import cpu_runtime
from t2mlr_jax.studies.benchmarks.side_by_side import run
from t2mlr_jax.studies.benchmarks.vs_ponderlm2_ours import main

if __name__ == "__main__":
    cpu_runtime.tune()
    run(main)
