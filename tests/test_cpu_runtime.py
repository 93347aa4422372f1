"""Importing the package tunes the CPU runtime before JAX starts its backend: its XLA:CPU flags join
XLA_FLAGS, and glibc malloc keeps freed memory for reuse. Settings the user made win over both."""

import os
import subprocess
import sys

import pytest

from t2mlr_jax.cpu_runtime import CPU_FLAGS

pytestmark = pytest.mark.slow


def _run(code: str, **env: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | env
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()


def _flags_after_import(user_flags: str) -> str:
    return _run("import os, t2mlr_jax; print(os.environ['XLA_FLAGS'])", XLA_FLAGS=user_flags)


def test_package_flags_are_added_and_the_users_own_win():
    added = _flags_after_import("--xla_force_host_platform_device_count=2")
    assert added.split() == [
        "--xla_force_host_platform_device_count=2",
        *(f"--{name}={value}" for name, value in CPU_FLAGS.items()),
    ]
    mine = " ".join(f"--{name}=false" for name in CPU_FLAGS)
    assert _flags_after_import(mine) == mine


# Page faults of the last 6 of 12 calls of a program with two 16 MiB temporaries (sin x, cos x): each call
# handed fresh pages faults both in again (12 temporaries' worth); kept pages fault now and then (a
# temporary placed where the heap has just grown).
FAULTS = """
import resource, t2mlr_jax, jax, jax.numpy as jnp
f = jax.jit(lambda x: (jnp.sin(x) @ jnp.cos(x)).sum())
x = jnp.ones((2048, 2048))
for _ in range(6):
    f(x).block_until_ready()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(6):
    f(x).block_until_ready()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
TEMP_PAGES = 2048 * 2048 * 4 // 4096


def test_temporaries_reuse_their_pages_unless_the_user_configured_malloc():
    assert int(_run(FAULTS)) < 6 * TEMP_PAGES  # measured: 0 to 2
    assert int(_run(FAULTS, MALLOC_ARENA_MAX="8")) > 10 * TEMP_PAGES  # measured: 12
