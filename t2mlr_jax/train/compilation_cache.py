"""The persistent XLA compilation cache: a rerun of a config (same shapes, same code, same jax) loads its
compiled programs (the train step for each sampled D, the state's init, eval, generation) from disk
instead of compiling them again. On this repo's 2-core CPU it takes the first step of
`python main.py --config=configs/smollm135m_t2mlr.py:cpu` from ~11 s to ~4 s (docs/startup.md).

On by default ("auto": USER_CACHE) on every backend. Programs that compile in under a second are not
kept (compiling them again is as quick). The test suite's pytest workers keep none (tests/conftest.py):
twice a worker, compiling thousands of programs, aborted inside XLA while serialising a CPU executable
for it (jax 0.10.2, not reproducible alone); the main.py runs the tests start do keep one."""

from __future__ import annotations

import os

DEFAULT = "auto"  # config.compilation_cache's default: USER_CACHE
USER_CACHE = "~/.cache/t2mlr_jax/xla"


def enable_compilation_cache(path: str | None, min_compile_seconds: float = 1.0) -> str | None:
    """Keep compiled programs under `path` ("auto": USER_CACHE; "" or None: off) unless a cache is already
    configured (the JAX_COMPILATION_CACHE_DIR variable, a test session's, an experiment's own); the
    directory in use."""
    import jax

    if jax.config.jax_compilation_cache_dir:
        return jax.config.jax_compilation_cache_dir
    if path == DEFAULT:
        path = USER_CACHE
    if not path:
        return None
    path = os.path.expanduser(str(path))
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", min_compile_seconds)
    return path
