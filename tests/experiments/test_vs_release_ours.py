"""Dry runs of our side of experiments/vs_release.py for the LRT and PonderLM-2 releases (no release needed):
each driver's main on a CPU-sized spec returns its four programs, timed and compiled, with finite losses,
the parameter counts the same for both of a pair's models where they should be, and with a profile window
its train steps' traces."""

import math
import os

import pytest

from t2mlr_jax.analysis.profile_ops import newest_trace, slowest_ops
from t2mlr_jax.studies.benchmarks import vs_lrt_ours, vs_ponderlm2_ours, vs_release, vs_release_ours

WORKLOAD = {
    "train": {"batch": 1, "seq_len": 8},
    "decode": {"batch": 1, "prompt_len": 4, "new_tokens": 2},
    "repeats": 1,
    "threads": len(os.sched_getaffinity(0)),  # the driver pins no fewer CPUs than the test process has
    "seed": 0,
}
TINY_GPT = {
    "sequence_len": 16,
    "vocab_size": 64,
    "n_layer": 2,
    "n_head": 2,
    "n_kv_head": 2,
    "n_embd": 32,
    "window_pattern": "SL",
}
TINY_LLAMA = {
    **vs_ponderlm2_ours.LLAMA,
    "vocab_size": 64,
    "hidden_size": 32,
    "num_layers": 2,
    "num_heads": 2,
    "num_kv_heads": 2,
    "head_dim": 16,
    "mlp_dim": 64,
    "max_seq_len": 64,
}


def check(result: dict, models: dict) -> None:
    assert result["side"] == "ours" and result["peak_rss_bytes"] > 0
    assert set(result["programs"]) == {f"{m}_{kind}" for m in models for kind in ("train", "decode")}
    for program in result["programs"].values():
        assert len(program["seconds"]) == 1 and program["compile_s"] > 0 and program["params"] > 0
    for m in models:
        assert math.isfinite(result["programs"][f"{m}_train"]["loss"])
        assert result["programs"][f"{m}_decode"]["new_tokens"] == 2


@pytest.mark.slow
def test_lrt_pair_ours_side_dry_run_with_a_profile(tmp_path):
    """--profile 2:3: each train step's second call after the timed ones traced; results.md's profile
    sections name their slowest ops."""
    profile = {"profile": [2, 3], "profile_dir": str(tmp_path / "profile")}
    spec = {**WORKLOAD, "model": TINY_GPT, "passes": 1, **profile}
    result = vs_lrt_ours.main(spec)
    check(result, vs_lrt_ours.MODELS)
    params = {m: result["programs"][f"{m}_train"]["params"] for m in vs_lrt_ours.MODELS}
    assert params["lrt"] > params["plain"]  # the feedback projections and gates, init value embeddings
    for m in vs_lrt_ours.MODELS:
        assert slowest_ops(newest_trace(tmp_path / "profile" / f"{m}_train"))["ops"]
    lines = vs_release.profiled(vs_release.RELEASES["lrt"], {"spec": spec})
    assert sum(line.startswith("slowest ops of the profiled steps") for line in lines) == 2


@pytest.mark.slow
def test_ponderlm2_pair_ours_side_dry_run():
    spec = {**WORKLOAD, **vs_ponderlm2_ours.model_spec(), "model": TINY_LLAMA}
    result = vs_ponderlm2_ours.main({**spec, "ponder": {**spec["ponder"], "jacobi_iterations": 1}})
    check(result, vs_ponderlm2_ours.MODELS)
    params = {m: result["programs"][f"{m}_train"]["params"] for m in vs_ponderlm2_ours.MODELS}
    assert params["ponder"] == params["plain"]  # PonderLM-2 adds no parameter


def test_the_t2mlr_sides_configs_take_the_spec():
    """vs_release --release t2mlr, our side: the spec's optimizer (lr and clipping on optimizer, the AdamW
    fields on optimizer.adamw) and shapes reach both configs, as the release's driver reads them."""
    spec = vs_release_ours.model_spec()
    spec["optimizer"] = {**spec["optimizer"], "lr": 1e-3, "b1": 0.5, "weight_decay": 0.25}
    for c, _, _ in vs_release_ours.models_of(spec).values():
        assert vs_release_ours.spec_of(c) == spec
