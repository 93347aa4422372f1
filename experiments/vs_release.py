"""This framework against an authors' PyTorch release, side by side on the CPU.
What it runs: t2mlr_jax/studies/benchmarks/vs_release.py (`python -m experiments.vs_release --help`)."""

from t2mlr_jax import cpu_runtime
from t2mlr_jax.studies.benchmarks.vs_release import main

if __name__ == "__main__":
    cpu_runtime.tune()
    main()
