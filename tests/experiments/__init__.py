"""Tests of the experiments package (experiments/, run as `python -m experiments.NAME`)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
