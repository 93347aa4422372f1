"""The paper's studies and the benchmarks as commands, each a thin entry point run from the repo root as
`python -m experiments.NAME` (`--help` says what it measures and writes); what each runs is a module of
t2mlr_jax/studies/. Nothing here is imported by t2mlr_jax, and this package imports nothing itself, so that
the release's Python (without JAX) can run the release-side drivers. So each entry point of ours calls
`t2mlr_jax.cpu_runtime.tune()` first in its `__main__`, rather than this file: the release's drivers
(make_*_fixture, release_args, benchmarks/*_torch) run the release's PyTorch as it comes, and our speed
drivers run tuned, as main.py does."""
