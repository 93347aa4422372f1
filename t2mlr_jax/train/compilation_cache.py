"""The persistent XLA compilation cache: a rerun of a config (same shapes, same code, same jax) loads its
compiled programs from disk instead of compiling them again.

By default ("auto") it is on for GPUs and TPUs and off on a CPU: with jax 0.10.2 a process aborted inside
XLA while serialising a CPU executable for the cache (twice, in the test suite's workers; not reproducible
alone), and an abort there kills the run. Naming a directory turns it on anywhere: on this repo's 2-core
CPU it took `python main.py --config=configs/smollm135m_t2mlr.py:cpu` from 96 s to 56 s (first step at 66
vs 40 s), back to back on a loaded machine."""

from __future__ import annotations

import os

DEFAULT = "auto"  # config.compilation_cache's default: USER_CACHE on GPU / TPU, off on CPU
USER_CACHE = "~/.cache/t2mlr_jax/xla"


def enable_compilation_cache(path: str | None, min_compile_seconds: float = 1.0) -> str | None:
    """Keep compiled programs under `path` ("auto": USER_CACHE unless the backend is the CPU; "" or None:
    off) unless a cache is already configured (the JAX_COMPILATION_CACHE_DIR variable, a test session's,
    an experiment's own); the directory in use."""
    import jax

    if jax.config.jax_compilation_cache_dir:
        return jax.config.jax_compilation_cache_dir
    if path == DEFAULT:
        path = USER_CACHE if jax.default_backend() != "cpu" else None
    if not path:
        return None
    path = os.path.expanduser(str(path))
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", min_compile_seconds)
    return path
