"""The host runtime, tuned once when the package is imported (before JAX starts its backend).

- XLA:CPU flags (`CPU_FLAGS`), added to XLA_FLAGS; a flag the user already set there wins. XLA aborts on
  a flag it does not know: these are known to the jaxlib range setup.cfg pins.
- A program that runs once (the train state's initialisation) compiles at XLA:CPU's optimisation level 1
  (`ONCE_OPTIONS`, per program): drawing a state is a few random-number kernels, which the default level
  spends seconds optimising (the 3.3M :cpu presets' init 3.7 -> 1.4 s to compile; at 135M 3.0 -> 1.5 s,
  and it runs no slower).
- glibc malloc keeps freed memory for reuse (`MALLOPT`). XLA:CPU allocates a call's temporaries afresh
  at every call (~1 GiB for a 135M train step); by default glibc serves each from a new mmap, which the
  kernel zero-fills page by page (262k page faults a step) and takes back at the end. Held in one heap,
  the next step reuses the same pages. What the compiler frees is handed back after every compilation
  of over a second (`trim`), so a process that compiles several large programs does not keep each
  one's scratch (trimming after each of a test suite's thousands of small ones cost it 18%). Any MALLOC_*
  variable or glibc.malloc tunable the user set leaves malloc as configured.
"""

from __future__ import annotations

import ctypes
import os
import platform

# copy insertion with region analysis: a train step updates parameters and optimizer moments in place
# instead of copying them first (135M plain step, one thread: ~9% faster, temporaries 1.46 -> 1.00 GiB).
CPU_FLAGS = {"xla_cpu_copy_insertion_use_region_analysis": "true"}
ONCE_OPTIONS = {"xla_backend_optimization_level": 1}
MALLOPT = {-8: 1, -4: 0, -1: -1}  # M_ARENA_MAX = 1, M_MMAP_MAX = 0, M_TRIM_THRESHOLD = -1 (never)
COMPILED = "/jax/core/compile/backend_compile_duration"  # jax's event after each XLA compilation
TRIM_AFTER_S = 1.0  # compilations this long leave scratch worth handing back; a tiny program's do not


def add_xla_flags() -> None:
    flags = os.environ.get("XLA_FLAGS", "")
    missing = [f"--{name}={value}" for name, value in CPU_FLAGS.items() if f"--{name}=" not in flags]
    os.environ["XLA_FLAGS"] = " ".join([flags, *missing]).strip()


def once_options(backend: str) -> dict:
    """XLA compiler options for a program that runs once on `backend` (jax.default_backend())."""
    return ONCE_OPTIONS if backend == "cpu" else {}


def _glibc():
    """The C library when it is glibc and the user left malloc unconfigured, else None."""
    user_set = any(k.startswith("MALLOC_") for k in os.environ) or "glibc.malloc" in os.environ.get(
        "GLIBC_TUNABLES", ""
    )
    if user_set or platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    return ctypes.CDLL(None)


LIBC = _glibc()


def trim() -> None:
    """Hand the heap's free pages back to the OS (a no-op where malloc is not ours to tune)."""
    if LIBC is not None:
        LIBC.malloc_trim(0)


def keep_freed_memory() -> None:
    if LIBC is None:
        return
    for param, value in MALLOPT.items():
        LIBC.mallopt(param, value)
    try:
        import jax.monitoring
    except ImportError:  # the PyTorch reference (interop.torch_reference) runs without JAX: nothing compiles
        return
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, duration, **_: trim() if event == COMPILED and duration > TRIM_AFTER_S else None
    )
