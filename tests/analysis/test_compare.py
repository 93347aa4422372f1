"""analysis/compare.py: the comparison main.py writes after a multi-architecture or multi-seed run — one
row per architecture, its seeds' mean, spread and range per length bin."""

import json

import pytest

from t2mlr_jax.analysis.compare import PLOT, write_comparison


def _summary(exact: float, by_length: dict[str, float]) -> dict:
    bins = {n: {"exact_match": v, "token_accuracy": v} for n, v in by_length.items()}
    return {
        "num_params": 100,
        "steps": 8,
        "eval": {"loss": 1 - exact, "token_accuracy": exact, "exact_match": exact, "by_length": bins},
    }


def test_seeds_are_reported_per_architecture_with_their_spread(tmp_path):
    summaries = {
        "t2mlr/seed0": _summary(1.0, {"1": 1.0, "2": 1.0}),
        "t2mlr/seed1": _summary(0.5, {"1": 1.0, "2": 0.0}),
        "t2mlr/seed2": _summary(0.75, {"1": 1.0, "2": 0.5}),
        "transformer/seed0": _summary(0.25, {"1": 0.5, "2": 0.0}),
        "transformer/seed1": _summary(0.25, {"1": 0.5, "2": 0.0}),
        "transformer/seed2": _summary(0.25, {"1": 0.5, "2": 0.0}),
    }
    result = write_comparison(tmp_path, summaries, title="demo")
    assert json.loads((tmp_path / "summary.json").read_text()) == result
    t2mlr, transformer = result["runs"]["t2mlr"], result["runs"]["transformer"]
    assert t2mlr["exact_match"] == pytest.approx(0.75)
    spread = {"mean": 0.75, "std": 0.25, "min": 0.5, "max": 1.0}
    assert t2mlr["spread"]["exact_match"] == pytest.approx(spread)
    assert t2mlr["by_length"]["2"]["exact_match"] == pytest.approx(0.5)
    assert t2mlr["by_length_range"]["2"] == [0.0, 1.0]
    assert sorted(t2mlr["seeds"]) == ["0", "1", "2"] and t2mlr["seeds"]["1"]["exact_match"] == 0.5
    assert transformer["spread"]["exact_match"]["std"] == 0.0
    assert (tmp_path / PLOT).read_bytes()[:4] == b"\x89PNG"
    # without seeds, one run per architecture as before
    plain = write_comparison(tmp_path, {"t2mlr": summaries["t2mlr/seed0"]}, title="one")
    assert plain["runs"]["t2mlr"]["exact_match"] == 1.0 and "seeds" not in plain["runs"]["t2mlr"]
