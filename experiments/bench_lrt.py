"""Cost of the Latent Recurrent Transformer against its vanilla backbone, side by side.
What it runs: t2mlr_jax/studies/benchmarks/bench_lrt.py (`python -m experiments.bench_lrt --help`)."""

from t2mlr_jax import cpu_runtime
from t2mlr_jax.studies.benchmarks.bench_lrt import main

if __name__ == "__main__":
    cpu_runtime.tune()
    main()
