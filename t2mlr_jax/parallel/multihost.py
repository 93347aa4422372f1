"""Multi-host start-up and batch assembly. On one host every function here is a cheap no-op."""

from __future__ import annotations

import os

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from t2mlr_jax.parallel.rules import partition_spec


def initialize_distributed() -> None:
    """`jax.distributed.initialize` where a multi-process launch is detected (TPU pod VMs, SLURM, or an
    explicit JAX_COORDINATOR_ADDRESS); nothing on a single host."""
    on_tpu_pod = bool(os.environ.get("TPU_WORKER_HOSTNAMES", "").count(","))
    on_slurm = int(os.environ.get("SLURM_NTASKS", "1")) > 1
    explicit = "JAX_COORDINATOR_ADDRESS" in os.environ
    if on_tpu_pod or on_slurm or explicit:
        jax.distributed.initialize()


def global_batch(local_batch: dict, mesh: Mesh) -> dict:
    """Each host holds only its rows of the batch; assemble the global, batch-sharded arrays."""
    def place(a):
        a = np.asarray(a)
        spec = partition_spec(("batch",) + (None,) * (a.ndim - 1), (a.shape[0] * jax.process_count(),)
                              + a.shape[1:], mesh)
        return jax.make_array_from_process_local_data(NamedSharding(mesh, spec), a)
    return {k: place(v) for k, v in local_batch.items()}
