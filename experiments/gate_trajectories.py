"""Fig. 8 of the T²MLR paper: the fusion gate over training, one line per run.
What it runs: t2mlr_jax/studies/gate_trajectories.py (`python -m experiments.gate_trajectories --help`)."""

from t2mlr_jax import cpu_runtime
from t2mlr_jax.studies.gate_trajectories import main

if __name__ == "__main__":
    cpu_runtime.tune()
    main()
