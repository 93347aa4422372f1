"""t2mlr-jax: transformers with deep-to-shallow temporal recurrence, in JAX (see README.md)."""

import os

# XLA:CPU flags, read when JAX starts its backend (so they apply where this package is imported before
# the first computation); a flag already in XLA_FLAGS wins. XLA aborts on a flag it does not know: these
# are known to the jaxlib range setup.cfg pins.
# - copy insertion with region analysis: a train step updates parameters and optimizer moments in place
#   instead of copying them first (135M plain step, one thread: ~9% faster, temporaries 1.46 -> 1.00 GiB).
CPU_FLAGS = {"xla_cpu_copy_insertion_use_region_analysis": "true"}

_flags = os.environ.get("XLA_FLAGS", "")
os.environ["XLA_FLAGS"] = " ".join(
    [_flags, *(f"--{name}={value}" for name, value in CPU_FLAGS.items() if f"--{name}=" not in _flags)]
).strip()
