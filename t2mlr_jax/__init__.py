"""t2mlr-jax: transformers with deep-to-shallow temporal recurrence, in JAX (see README.md)."""
