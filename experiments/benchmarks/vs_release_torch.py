"""The T²MLR release's side of experiments/vs_release.py, under the release's Python.
What it runs: t2mlr_jax/studies/benchmarks/vs_release_torch.py (python -m
experiments.benchmarks.vs_release_torch '<spec json>')."""

from t2mlr_jax.studies.benchmarks.side_by_side import run
from t2mlr_jax.studies.benchmarks.vs_release_torch import main

if __name__ == "__main__":
    run(main)
