"""Recirculation's claims on the shipped SmolLM2-135M, measured with the protocol.
What it runs: t2mlr_jax/studies/recirculation_study.py (`python -m experiments.recirculation_study -h`)."""

from t2mlr_jax import cpu_runtime
from t2mlr_jax.studies.recirculation_study import main

if __name__ == "__main__":
    cpu_runtime.tune()
    main()
