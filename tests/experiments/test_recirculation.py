"""experiments/recirculation.py and the sweep behind it, on a tiny random 3-layer model saved as a checkpoint
(the SmolLM2 vocabulary, so that the shipped tokenizer and Shakespeare windows serve): --help, one run of
2 pairs x 1 alpha writing every file with finite changes and the plain model's perplexity as its baseline,
a rerun that scores nothing, and one clear error per bad setting before anything is read or compiled."""

import json
import math
import subprocess
import sys

import jax
import numpy as np
import optax
import pytest

from t2mlr_jax.config_utils import backbone_preset, config_module, set_path
from t2mlr_jax.interop import load_pretrained, save_params
from t2mlr_jax.model import backbone
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.params import init_params
from t2mlr_jax.train import recirculation_sweep as sweep
from tests.experiments import ROOT

TINY = ModelConfig(
    vocab_size=49152,
    hidden_size=32,
    num_layers=3,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    mlp_dim=64,
    max_seq_len=64,
)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("recirculation") / "tiny"
    save_params(path, TINY, jax.device_get(init_params(TINY, jax.random.PRNGKey(0))))
    return path


def _config(checkpoint, **changes):
    """The cpu preset on the tiny model: windows of 32 tokens (2 batches of 2), alpha 0.5, pairs (1, 0) and
    (2, 1), the looping control and one serial check."""
    config = config_module(ROOT / "configs" / "recirculation.py").get_config("cpu")
    fields = {
        **backbone_preset(TINY),
        "init_from": str(checkpoint),
        "data.seq_len": 32,
        "data.eval_seq_len": 32,
        "eval.batch_size": 2,
        "eval.num_examples": 4,
        "recirculation.source": 2,
        "recirculation.destination": 1,
        "recirculation.sweep_alphas": "0.5",
        "recirculation.sweep_stride": 1,
        "recirculation.sweep_max_gap": 1,
        **changes,
    }
    for path, value in fields.items():
        set_path(config, path, value)
    return config


def _refuse(*args, **kwargs):
    raise AssertionError("a cell was scored")


def test_help_lists_the_flags():
    out = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / "recirculation.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "--config" in out.stdout and "--workdir" in out.stdout and "heatmap_looping.png" in out.stdout


def test_sweep_writes_every_file_and_a_rerun_scores_nothing(tmp_path, checkpoint, monkeypatch):
    config, workdir = _config(checkpoint), tmp_path / "sweep"
    results = sweep.run_sweep(config, workdir)
    lines = [json.loads(line) for line in (workdir / sweep.CELLS).read_text().splitlines()]
    assert [(r["kind"], r["source"], r["destination"]) for r in lines] == [
        ("baseline", -1, -1),
        ("recirculation", 1, 0),
        ("recirculation", 2, 1),
        ("looping", 1, 0),
        ("looping", 2, 1),
        ("check", results["best"]["source"], results["best"]["destination"]),
    ]
    assert all(math.isfinite(r["change_pct"]) for r in lines[1:5])
    assert any(r["change_pct"] != 0 for r in lines[1:5])  # recirculation and looping act
    check = results["serial_check"][0]
    assert check["perplexity_rel_diff"] < 1e-4 and check["parallel"]["passes"]["max"] <= 16
    for name in ("results.json", "heatmap_ratio_alpha0.5.png", "heatmap_looping.png", "gain_by_position.png"):
        assert (workdir / name).stat().st_size > 0
    assert json.loads((workdir / sweep.RESULTS).read_text())["best"] == results["best"]

    # The baseline is the plain model's perplexity over the same windows.
    _, params = load_pretrained(checkpoint)
    nll = tokens = 0.0
    plain = jax.jit(backbone.forward, static_argnums=0)
    for batch in sweep.windows(config):
        layout = dict(positions=batch["positions"], segment_ids=batch["segment_ids"])
        logits = plain(TINY, params, batch["tokens"], **layout)
        mask = batch["loss_mask"]
        nll += float((optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]) * mask).sum())
        tokens += float(mask.sum())
    np.testing.assert_allclose(results["baseline"]["perplexity"], math.exp(nll / tokens), rtol=1e-5)

    monkeypatch.setattr(sweep, "_token_nll", _refuse)
    again = sweep.run_sweep(config, workdir)
    assert again["grid"] == results["grid"] and again["timings"]["evaluated_now"] == 0
    assert len((workdir / sweep.CELLS).read_text().splitlines()) == len(lines)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"recirculation.source": 1}, "must be deeper"),
        ({"recirculation.source": 3}, "blocks 0..2"),
        ({"recirculation.sweep_alphas": "0.5,1.5"}, r"\(0, 1\]"),
        ({"recirculation.sweep_schemes": "ratio,ratios"}, "scheme must be one of"),
        ({"data.eval_seq_len": 128}, "longer than the model's context"),
    ],
)
def test_bad_settings_fail_before_anything_runs(tmp_path, checkpoint, monkeypatch, changes, message):
    monkeypatch.setattr(sweep, "_token_nll", _refuse)
    monkeypatch.setattr(sweep, "build_data_source", _refuse)
    with pytest.raises(ValueError, match=message):
        sweep.run_sweep(_config(checkpoint, **changes), tmp_path / "sweep")
    assert not (tmp_path / "sweep").exists()
