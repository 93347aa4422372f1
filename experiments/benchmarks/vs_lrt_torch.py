"""The LRT release's side of `experiments/vs_release.py --release lrt`, under the release's Python.
What it runs: t2mlr_jax/studies/benchmarks/vs_lrt_torch.py (python -m experiments.benchmarks.vs_lrt_torch
'<spec json>')."""

from t2mlr_jax.studies.benchmarks.side_by_side import run
from t2mlr_jax.studies.benchmarks.vs_lrt_torch import main

if __name__ == "__main__":
    run(main)
