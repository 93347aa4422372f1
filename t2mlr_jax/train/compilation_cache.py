"""The persistent XLA compilation cache, on by default: a rerun of a config (same shapes, same code, same
jax) loads its compiled steps from disk instead of compiling them again, which on a CPU is most of a small
run's start-up."""

from __future__ import annotations

import os

DEFAULT = "~/.cache/t2mlr_jax/xla"  # config.compilation_cache's default


def enable_compilation_cache(path: str | None, min_compile_seconds: float = 1.0) -> str | None:
    """Keep compiled programs under `path` ("" or None: off) unless a cache is already configured (the
    JAX_COMPILATION_CACHE_DIR variable, a test session's, an experiment's own); the directory in use."""
    import jax

    if jax.config.jax_compilation_cache_dir:
        return jax.config.jax_compilation_cache_dir
    if not path:
        return None
    path = os.path.expanduser(str(path))
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", min_compile_seconds)
    return path
