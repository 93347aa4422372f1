"""T²MLR's headline claims at CPU scale, measured with the protocol.
What it runs: t2mlr_jax/studies/t2mlr_study.py (`python -m experiments.t2mlr_study --help`)."""

from t2mlr_jax import cpu_runtime
from t2mlr_jax.studies.t2mlr_study import main

if __name__ == "__main__":
    cpu_runtime.tune()
    main()
