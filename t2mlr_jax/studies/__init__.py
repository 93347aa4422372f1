"""The top floor: the paper's studies, the benchmarks, the release fixtures' drivers and the release parity
harness, each built on the library below (experiments with `t2mlr_jax.experiment.resolve`). Their command
lines are the thin entry points of experiments/ (`python -m experiments.NAME --help`). This package and
its subpackages import nothing of ours on import, so that the release's Python (without JAX) can run the
release-side drivers (fixtures/, benchmarks/vs_*_torch.py)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout: its configs/, experiments/ and tests/
