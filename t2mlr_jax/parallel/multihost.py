"""Multi-host start-up and batch assembly. On one host every function here is a cheap no-op."""

from __future__ import annotations

import os

import jax
import numpy as np
from jax.sharding import Mesh

from t2mlr_jax.parallel.placement import batch_sharding


def initialize_distributed() -> None:
    """`jax.distributed.initialize` where a multi-process launch is detected (TPU pod VMs, SLURM, or an
    explicit JAX_COORDINATOR_ADDRESS); nothing on a single host."""
    on_tpu_pod = bool(os.environ.get("TPU_WORKER_HOSTNAMES", "").count(","))
    on_slurm = int(os.environ.get("SLURM_NTASKS", "1")) > 1
    explicit = "JAX_COORDINATOR_ADDRESS" in os.environ
    if on_tpu_pod or on_slurm or explicit:
        jax.distributed.initialize()


def global_batch(local_batch: dict, mesh: Mesh) -> dict:
    """Each host holds only its rows of the batch; assemble the global arrays, rows over data x fsdp."""
    sharding = batch_sharding(mesh)
    return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v)) for k, v in local_batch.items()}
