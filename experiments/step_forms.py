"""The CPU step-form figures of docs/performance.md, the variants interleaved in one process.
What it runs: t2mlr_jax/studies/benchmarks/step_forms.py (`python -m experiments.step_forms --help`)."""

from t2mlr_jax import cpu_runtime
from t2mlr_jax.studies.benchmarks.step_forms import main

if __name__ == "__main__":
    cpu_runtime.tune()
    main()
