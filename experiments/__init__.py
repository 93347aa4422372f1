"""The paper's studies and the benchmarks, each a module run from the repo root as
`python -m experiments.NAME` (`--help` says what it measures and writes). Nothing here is imported by
t2mlr_jax; this package imports nothing itself, so that the release's Python (without t2mlr_jax) can run
the release-side drivers."""
