"""The host runtime of a CPU process, tuned by the entry points (main.py, tools/, experiments/, the tests'
conftest) with `tune()` before JAX starts its backend, and only when the CPU is the backend to expect.
Importing the package tunes nothing: a notebook, lm-eval or an accelerator's host gets the process as is.

- Only the CPU, where no accelerator's device file exists and JAX_PLATFORMS is unset: with libtpu installed
  (the test extra brings it, for tools/aot_compile.py's TPU compiles) JAX would otherwise try a TPU first,
  printing libtpu's initialisation errors before the program's own output and spending seconds on it.
  The AOT tool still compiles for TPU topologies: it asks libtpu for a topology, not for a backend.
- XLA:CPU flags (`CPU_FLAGS`), added to XLA_FLAGS; a flag the user already set there wins. XLA aborts on
  a flag it does not know: these are known to the jaxlib range setup.cfg pins.
- A program that runs once (the train state's initialisation) compiles at XLA:CPU's optimisation level 1
  (`ONCE_OPTIONS`, per program: the trainer asks for it on a CPU backend, whatever the entry point):
  drawing a state is a few random-number kernels, which the default level spends seconds optimising (the
  3.3M :cpu presets' init 3.7 -> 1.4 s to compile; at 135M 3.0 -> 1.5 s, and it runs no slower).
- glibc malloc keeps freed memory for reuse (`MALLOPT`). XLA:CPU allocates a call's temporaries afresh
  at every call (~1 GiB for a 135M train step); by default glibc serves each from a new mmap, which the
  kernel zero-fills page by page (262k page faults a step) and takes back at the end. Held in one heap,
  the next step reuses the same pages. What the compiler frees is handed back (malloc_trim, from a
  jax.monitoring listener) after every compilation of over a second, so a process that compiles several
  large programs does not keep each one's scratch (trimming after each of a test suite's thousands of
  small ones cost it 18%). Any MALLOC_* variable or glibc.malloc tunable the user set leaves malloc as
  configured.
"""

from __future__ import annotations

import ctypes
import gc
import glob
import os
import platform

import jax
import jax.monitoring

# copy insertion with region analysis: a train step updates parameters and optimizer moments in place
# instead of copying them first (135M plain step, one thread: ~9% faster, temporaries 1.46 -> 1.00 GiB).
CPU_FLAGS = {"xla_cpu_copy_insertion_use_region_analysis": "true"}
ONCE_OPTIONS = {"xla_backend_optimization_level": 1}
MALLOPT = {-8: 1, -4: 0, -1: -1}  # M_ARENA_MAX = 1, M_MMAP_MAX = 0, M_TRIM_THRESHOLD = -1 (never)
COMPILED = "/jax/core/compile/backend_compile_duration"  # jax's event after each XLA compilation
TRIM_AFTER_S = 1.0  # compilations this long leave scratch worth handing back; a tiny program's do not
# An accelerator's device files in DEVICES (TPU VM: accel<n> or vfio/<n>; NVIDIA: nvidia<n>): where one is
# present JAX picks it over the CPU.
DEVICES = "/dev"
ACCELERATOR_FILES = ("accel*", "vfio/[0-9]*", "nvidia[0-9]*")


def cpu_backend_expected() -> bool:
    """Whether JAX will run on the CPU, told without starting a backend (which would read XLA_FLAGS too
    early): JAX_PLATFORMS's first entry when it is set, else no accelerator's device file. A wrong guess
    costs a CPU flag missed, or a CPU-only one set where it does nothing."""
    platforms = os.environ.get("JAX_PLATFORMS", "")
    if platforms:
        return platforms.split(",")[0].strip() == "cpu"
    return not any(glob.glob(os.path.join(DEVICES, pattern)) for pattern in ACCELERATOR_FILES)


def tune() -> None:
    """An entry point's first call: the CPU alone, its XLA flags and malloc's settings, when the CPU is the
    backend to expect."""
    if cpu_backend_expected():
        cpu_only()
        add_xla_flags()
        keep_freed_memory()


def cpu_only() -> None:
    """JAX's platforms set to the CPU alone, unless the user chose them (JAX_PLATFORMS)."""
    if not os.environ.get("JAX_PLATFORMS"):
        jax.config.update("jax_platforms", "cpu")


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


def keep_freed_memory() -> None:
    libc = _glibc()
    if libc is None:
        return
    for param, value in MALLOPT.items():
        libc.mallopt(param, value)
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, duration, **_: (
            libc.malloc_trim(0) if event == COMPILED and duration > TRIM_AFTER_S else None
        )
    )


def hand_back() -> None:
    """Garbage collected, and what malloc holds free handed back to the system (glibc): between the parts
    of a process whose peak memory counts (a benchmark's rows), so one part's leftovers do not lift the
    next one's peak."""
    gc.collect()
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
