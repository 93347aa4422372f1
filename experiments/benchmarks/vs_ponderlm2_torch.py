"""PonderLM-2's side of `experiments/vs_release.py --release ponderlm2`, under its Python.
What it runs: t2mlr_jax/studies/benchmarks/vs_ponderlm2_torch.py (python -m
experiments.benchmarks.vs_ponderlm2_torch '<spec json>')."""

from t2mlr_jax.studies.benchmarks.side_by_side import run
from t2mlr_jax.studies.benchmarks.vs_ponderlm2_torch import main

if __name__ == "__main__":
    run(main)
