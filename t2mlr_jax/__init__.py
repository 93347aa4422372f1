"""t2mlr-jax: transformers with deep-to-shallow temporal recurrence, in JAX (see README.md)."""

from t2mlr_jax import cpu_runtime

cpu_runtime.add_xla_flags()
cpu_runtime.keep_freed_memory()
