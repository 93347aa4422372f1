"""Why the default `gated` mixer stays closed on the CPU demo, and what opens it (issue 11).
What it runs: t2mlr_jax/studies/gate_opening.py (`python -m experiments.gate_opening --help`)."""

from t2mlr_jax import cpu_runtime
from t2mlr_jax.studies.gate_opening import main

if __name__ == "__main__":
    cpu_runtime.tune()
    main()
