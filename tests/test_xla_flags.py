"""Importing the package adds its XLA:CPU flags to XLA_FLAGS (read when JAX starts its backend); a flag
the user already set wins."""

import os
import subprocess
import sys

from t2mlr_jax import CPU_FLAGS


def _flags_after_import(user_flags: str) -> str:
    code = "import os, t2mlr_jax; print(os.environ['XLA_FLAGS'])"
    env = {**os.environ, "XLA_FLAGS": user_flags}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_package_flags_are_added_and_the_users_own_win():
    added = _flags_after_import("--xla_force_host_platform_device_count=2")
    assert added.split() == [
        "--xla_force_host_platform_device_count=2",
        *(f"--{name}={value}" for name, value in CPU_FLAGS.items()),
    ]
    mine = " ".join(f"--{name}=false" for name in CPU_FLAGS)
    assert _flags_after_import(mine) == mine
