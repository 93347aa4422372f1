"""How this process was launched, told from the environment alone (no JAX, so a program can act on it
before importing anything heavy): one of several processes, or the only one."""

from __future__ import annotations

import os


def several_processes() -> bool:
    """A multi-process launch: TPU pod VMs, SLURM tasks, or an explicit JAX_COORDINATOR_ADDRESS (any
    cluster; also several CPU processes on one machine). multihost.initialize_distributed starts them."""
    on_tpu_pod = bool(os.environ.get("TPU_WORKER_HOSTNAMES", "").count(","))
    on_slurm = int(os.environ.get("SLURM_NTASKS", "1")) > 1
    return on_tpu_pod or on_slurm or "JAX_COORDINATOR_ADDRESS" in os.environ
