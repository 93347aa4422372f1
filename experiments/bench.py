"""Cost of T²MLR against its parameter-matched transformer (the paper's Tables 7, 8 and 12).
What it runs: t2mlr_jax/studies/benchmarks/bench.py (`python -m experiments.bench --help`)."""

from t2mlr_jax import cpu_runtime
from t2mlr_jax.studies.benchmarks.bench import main

if __name__ == "__main__":
    cpu_runtime.tune()
    main()
