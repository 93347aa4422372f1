"""config.init_from on a tiny T²MLR orbax checkpoint: a matching recurrence continues with the stored mixer,
another one is one clear error naming the field, and a resumed run never reads the pretrained file; a
finetuning config needs a checkpoint or init_from=random."""

import logging
import os

import jax
import numpy as np
import pytest

from t2mlr_jax.architectures import build_architecture
from t2mlr_jax.config.edit import config_module
from t2mlr_jax.experiment import resolve
from t2mlr_jax.interop import save_params
from t2mlr_jax.model import layer_layout
from t2mlr_jax.model.params import init_params
from t2mlr_jax.train import init_from
from t2mlr_jax.train.trainer import Run, train
from tests.tiny import tiny_experiment
from tests.train.tiny_task import tiny_source

CONFIGS = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs"
)


@pytest.fixture
def checkpoint(tmp_path):
    """A T²MLR checkpoint of the tiny config with a trained-looking mixer (γ_rec = 0.25)."""
    cfg = resolve(tiny_experiment()).model
    params = jax.device_get(init_params(cfg, jax.random.PRNGKey(7)))
    params["mixer"]["rezero_gamma_recurrent_gate"] = np.full((1,), 0.25, np.float32)
    save_params(tmp_path / "pretrained", cfg, params)
    return tmp_path / "pretrained", params


def _config(path, **train_fields):
    config = tiny_experiment(**train_fields)
    config.init_from = str(path)
    config.model.recurrence.d_forward = 3  # D is a training choice, not part of the model
    return config


def test_a_t2mlr_checkpoint_starts_a_run_with_its_mixer(tmp_path, checkpoint):
    path, params = checkpoint
    run = Run(resolve(_config(path)), tmp_path / "run", tiny_source(), "t2mlr")
    state, _ = run.restore_or_init(run.checkpointer())
    assert jax.tree.all(jax.tree.map(np.array_equal, jax.device_get(state.params), params))


def test_a_run_with_layers_apart_gets_the_checkpoint_per_layer(checkpoint):
    path, params = checkpoint
    config = _config(path)
    config.model.scan_layers = False
    config = resolve(config)
    loaded = init_from.start_weights(config, build_architecture(config))()
    expected = layer_layout.per_layer(params)
    assert jax.tree.structure(loaded) == jax.tree.structure(expected)
    assert jax.tree.all(jax.tree.map(np.array_equal, loaded, expected))


def test_another_recurrence_is_one_clear_error(checkpoint):
    config = _config(checkpoint[0])
    config.model.recurrence.l_start = 0
    config = resolve(config)
    arch = build_architecture(config)  # builds: the checkpoint is checked with the run's start weights
    with pytest.raises(ValueError, match=r"1 differing fields: recurrence.l_start: 1 \(checkpoint\) vs 0"):
        init_from.start_weights(config, arch)


@pytest.mark.slow
def test_a_resumed_run_does_not_read_the_pretrained_weights(tmp_path, checkpoint, monkeypatch):
    train(
        Run(
            resolve(_config(checkpoint[0], steps=2, checkpoint_every=2)),
            tmp_path / "run",
            tiny_source(),
            "t2mlr",
        )
    )

    def refuse(*args, **kwargs):
        raise AssertionError("the pretrained weights were read on resume")

    monkeypatch.setattr(init_from, "load_pretrained", refuse)
    summary = train(
        Run(
            resolve(_config(checkpoint[0], steps=3, checkpoint_every=2)),
            tmp_path / "run",
            tiny_source(),
            "t2mlr",
        )
    )
    assert summary["steps"] == 3


def test_a_finetuning_config_refuses_an_empty_init_from_and_takes_random_said_so(caplog):
    """--config.init_from= (empty) on a config that finetunes trained random weights before; now it is the
    same error as an unset one, and init_from=random trains from random weights, named in the log."""
    gsm8k = config_module(os.path.join(CONFIGS, "gsm8k.py")).get_config("baseline")
    gsm8k.init_from = ""
    typed = resolve(gsm8k)
    with pytest.raises(ValueError, match="init_from is required .* or --config.init_from=random to train"):
        init_from.start_weights(typed, build_architecture(typed))
    gsm8k.init_from = "random"
    typed = resolve(gsm8k)
    with caplog.at_level(logging.WARNING):
        assert init_from.start_weights(typed, build_architecture(typed)) is None
    assert (
        "init_from=random: transformer starts from random weights, not from the pretrained model"
        in caplog.text
    )
    pretraining = config_module(os.path.join(CONFIGS, "smollm135m_t2mlr.py")).get_config("baseline")
    for value in ("", "random"):  # random weights either way; nothing to load, so param_match may widen
        pretraining.init_from = value
        typed = resolve(pretraining)
        assert init_from.start_weights(typed, build_architecture(typed)) is None
