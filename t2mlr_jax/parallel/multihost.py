"""Multi-host start-up, batch assembly, and who writes files. On one host every function here is a cheap
no-op (or True)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from t2mlr_jax.parallel.launch import several_processes
from t2mlr_jax.parallel.placement import batch_sharding


def initialize_distributed() -> bool:
    """`jax.distributed.initialize` where a multi-process launch is detected (`launch.several_processes`),
    with JAX_COORDINATOR_ADDRESS (host:port of process 0), JAX_NUM_PROCESSES and JAX_PROCESS_ID where the
    launch is explicit. Nothing on a single host. Whether this is one process of several (else it is the
    lead, told without starting a backend)."""
    if not several_processes():
        return False
    if "JAX_COORDINATOR_ADDRESS" in os.environ:
        missing = [v for v in ("JAX_NUM_PROCESSES", "JAX_PROCESS_ID") if v not in os.environ]
        if missing:
            raise ValueError(
                f"JAX_COORDINATOR_ADDRESS is set but {' and '.join(missing)} not: an explicit "
                "multi-process launch needs all three"
            )
        # CPU processes need gloo collectives; other platforms ignore the setting.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            num_processes=int(os.environ["JAX_NUM_PROCESSES"]), process_id=int(os.environ["JAX_PROCESS_ID"])
        )
    else:
        jax.distributed.initialize()
    return True


def is_lead_host() -> bool:
    """Process 0 writes the run's files (metrics, summaries, plots); every process computes."""
    return jax.process_index() == 0


def global_batch(local_batch: dict, mesh: Mesh) -> dict:
    """Each host holds only its rows of the batch; assemble the global arrays, rows over data x fsdp."""
    sharding = batch_sharding(mesh)
    return {
        k: jax.make_array_from_process_local_data(sharding, np.asarray(v)) for k, v in local_batch.items()
    }


def to_host(tree):
    """Arrays as numpy, whole, on every host, however they are sharded (a multi-host sharded array is
    gathered: every host must call this in the same order)."""

    def fetch(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
            return multihost_utils.process_allgather(x, tiled=True)
        return jax.device_get(x)

    return jax.tree.map(fetch, tree)


def all_hosts_rows(local_batches: Iterable[dict]) -> Iterator[dict]:
    """Each host's share of the eval set as the same whole batches on every host (host 0's rows first), so
    every host evaluates and scores every row. Every host must yield the same number of batches."""
    for batch in local_batches:
        yield batch if jax.process_count() == 1 else multihost_utils.process_allgather(batch, tiled=True)
