"""Table 13 of the T²MLR paper: how well each layer's hidden state anticipates future tokens.
What it runs: t2mlr_jax/studies/future_token_probe.py (`python -m experiments.future_token_probe --help`)."""

from t2mlr_jax import cpu_runtime
from t2mlr_jax.studies.future_token_probe import main

if __name__ == "__main__":
    cpu_runtime.tune()
    main()
