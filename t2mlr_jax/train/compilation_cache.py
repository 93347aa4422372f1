"""The persistent XLA compilation cache: a rerun of a config (same shapes, same code, same jax) loads its
compiled programs (the train step for each sampled D, the state's init, eval, generation) from disk
instead of compiling them again. On this repo's 2-core CPU it takes the first step of
`python main.py --config=configs/smollm135m_t2mlr.py:cpu` from ~11 s to ~4 s (docs/startup.md).

On by default ("auto": USER_CACHE) on every backend. Programs that compile in under a second are not
kept (compiling them again is as quick). The test suite's pytest workers keep none (tests/conftest.py):
twice a worker, compiling thousands of programs, aborted inside XLA while serialising a CPU executable
for it (jax 0.10.2, not reproducible alone); the main.py runs the tests start do keep one.

And in memory (`compile_in_process`): runs in one process (a study's seeds, the tests') share one
executable per program instead of compiling it again."""

from __future__ import annotations

import os
import re
from typing import Any

_COMPILED: dict[tuple, Any] = {}  # in-process: lowered program -> its executable, least recently used first
# the executables kept: each holds its compiled code in memory, and a long process (a sweep over many
# configs) need not hold every one it ran; a test worker asks for 35-110, ~30-36 of them distinct
KEEP = 64
# a host callback's custom call names only its index in the program's own list of Python functions
_CALLBACK = re.compile(r"@\w*python\w*callback")

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


def compile_in_process(lowered: Any, devices: Any, options: dict | None = None) -> Any:
    """`lowered.compile(options)`, once per process for a program with the same text, arguments, result
    tree, `devices` (a mesh's, in order) and options: in-process runs of one config (a study's seeds and
    rows, a test's trainings) share the executable rather than compiling it again. Nothing goes to disk;
    the `KEEP` most recently used are kept. A program that calls back into Python is compiled every time:
    its text does not say which function."""
    import jax

    text = lowered.as_text()
    if _CALLBACK.search(text):
        return lowered.compile(options)
    args = jax.tree.leaves(lowered.args_info)  # all: the text leaves out those the program never reads
    key = (
        text,
        str(lowered.in_tree),
        tuple((a.shape, str(a.dtype), a.donated) for a in args),
        str(lowered.out_tree),
        tuple(d.id for d in devices),
        tuple(sorted((options or {}).items())),
    )
    executable = _COMPILED.pop(key, None)
    if executable is None:
        executable = lowered.compile(options)
    _COMPILED[key] = executable  # now the most recently used
    while len(_COMPILED) > KEEP:
        del _COMPILED[next(iter(_COMPILED))]
    return executable


def in_process(jitted: Any, devices: Any) -> Any:
    """`jitted` (a jax.jit function) with its executables from `compile_in_process`: one per signature of
    its arguments (tree, types, shardings), shared with every other run in the process."""
    import jax

    executables: dict[tuple, Any] = {}

    def call(*args):
        leaves, tree = jax.tree.flatten(args)
        signature = (tree, *((jax.typeof(x), getattr(x, "sharding", None)) for x in leaves))
        if signature not in executables:
            executables[signature] = compile_in_process(jitted.lower(*args), devices)
        return executables[signature](*args)

    return call
