"""The paper's studies and the benchmarks, each a module run from the repo root as
`python -m experiments.NAME` (`--help` says what it measures and writes). Nothing here is imported by
t2mlr_jax; this package imports nothing itself, so that the release's Python (without t2mlr_jax) can run
the release-side drivers. So each module of ours with a `__main__` calls `t2mlr_jax.cpu_runtime.tune()`
first there, rather than this file: the release's drivers (make_*_fixture, release_args,
benchmarks/*_torch) run the release's PyTorch as it comes, and our speed drivers run tuned, as main.py
does."""
