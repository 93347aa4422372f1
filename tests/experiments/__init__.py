"""Tests of the studies (t2mlr_jax/studies/) and their entry points (experiments/, run as
`python -m experiments.NAME`)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
