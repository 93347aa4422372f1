"""XLA flags for the tests' processes: the tiny test models are compile-bound, not run-bound, and XLA's CPU
backend without LLVM optimisation and with its older (non-MLIR) fusion emitters compiles a Jacobi gradient
2.4x faster. Subprocesses that set their own device count pass these too.

Flags the suite was started with (`XLA_FLAGS=--xla_cpu_max_isa=AVX2 make test`, docs/testing.md) are
carried into every process it starts, so the whole suite runs under the instruction set asked for."""

import os

FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
DEVICE_COUNT = "--xla_force_host_platform_device_count"


def carried() -> list[str]:
    """The flags in XLA_FLAGS that the tests do not set themselves (the instruction set, for one)."""
    ours = (DEVICE_COUNT, *(flag.split("=")[0] for flag in FAST_COMPILE.split()))
    return [flag for flag in os.environ.get("XLA_FLAGS", "").split() if not flag.startswith(ours)]


def with_devices(count: int) -> str:
    return " ".join([*carried(), f"{DEVICE_COUNT}={count}", FAST_COMPILE])
