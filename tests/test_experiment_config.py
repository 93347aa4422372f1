"""The typed experiment (t2mlr_jax.config): one conversion to and from the ConfigDict that config files and
--config.a.b=v edit, every field checked on the way in, and the plain dict checkpoints store."""

import dataclasses

import pytest

from t2mlr_jax.config.convert import to_config_dict, to_dict
from t2mlr_jax.config.edit import dotted_keys, set_path
from t2mlr_jax.config.sections import SECTIONS
from t2mlr_jax.experiment import experiment, from_config_dict, resolve
from tests.tiny import task_model


def _config():
    return experiment(name="unit", model=task_model(), data={"task": "s5_retrieval"})


def test_the_config_dict_round_trips_through_the_typed_experiment():
    typed = resolve(_config())
    assert from_config_dict(to_config_dict(typed)) == typed
    assert from_config_dict(to_dict(typed)) == typed  # what run_config.json holds reads back the same
    assert set(SECTIONS.names()) <= set(dotted_keys(to_config_dict(typed)))  # every registered section


def test_edits_at_the_edge_reach_the_typed_sections():
    config = _config()
    set_path(config, "train.steps", 7)
    set_path(config, "t2mlr.forward_mode", "exact")
    config.eval.window = 32
    typed = resolve(config)
    assert (typed.train.steps, typed.t2mlr.forward_mode, typed.eval.window) == (7, "exact", 32)
    with pytest.raises(dataclasses.FrozenInstanceError):
        typed.train.steps = 8  # below main.py nothing edits the experiment; replace() makes a copy
    assert typed.replace(train={"steps": 8}, t2mlr={"bptt": 2}).train.steps == 8
    assert typed.replace(t2mlr={"bptt": 2}).t2mlr.bptt == 2


@pytest.mark.parametrize(
    ("path", "value", "error", "message"),
    [
        ("train.stesp", 3, KeyError, r"train.stesp is not a config field \(did you mean 'train.steps'"),
        ("optimizer.schedule", "cosin", ValueError, r"unknown schedule 'cosin'.*did you mean 'cosine'"),
        ("optimizer.name", "adam", ValueError, r"unknown optimizer 'adam'.*did you mean 'adamw'"),
        ("optimizer.muon.b1", 1.0, ValueError, r"optimizer.muon.b1 must be in \[0, 1\), got 1.0"),
        ("train.grad_accum", 3, ValueError, r"train.batch_size \(16\) must be divisible by train.grad_accum"),
        ("data.kind", "txt", ValueError, r"data.kind must be one of \('generated', 'file', 'text'\)"),
        ("lstm.layers", 0, ValueError, r"lstm.layers must be >= 1, got 0"),
        # a generated task's options are its generator's settings, checked as one section
        (
            "data.options.max_acions",
            5,
            KeyError,
            r"data.options.max_acions is not .*did you mean 'max_actions'",
        ),
        ("data.options.max_actions", "5", ValueError, r"data.options.max_actions must be int, got '5'"),
        ("data.eval_options.value_len", 0, ValueError, r"value_len must be >= 1, got 0"),
    ],
)
def test_a_bad_field_is_one_clear_error(path, value, error, message):
    with pytest.raises(error, match=message):
        config = _config()
        set_path(config, path, value)
        resolve(config)


def test_a_stored_config_with_a_wrong_type_or_an_unknown_section_is_refused():
    stored = to_dict(resolve(_config()))
    with pytest.raises(ValueError, match=r"train.steps must be int, got '10'"):
        from_config_dict({**stored, "train": {**stored["train"], "steps": "10"}})
    with pytest.raises(KeyError, match=r"lstn is not a config section \(did you mean 'lstm'"):
        from_config_dict({**stored, "lstn": {}})
    with pytest.raises(AttributeError, match=r"no field or section 'lstn' \(did you mean 'lstm'"):
        getattr(resolve(_config()), "lstn")  # noqa: B009  (the attribute access is what is tested)


def test_an_optimizers_and_a_schedules_own_settings_are_sections_under_optimizer():
    config = _config()
    set_path(config, "optimizer.muon.matrix_lr", 0.01)
    set_path(config, "optimizer.wsd.decay_steps", 5)
    typed = resolve(config)
    assert (typed.optimizer.muon.matrix_lr, typed.optimizer.wsd.decay_steps) == (0.01, 5)
    assert typed.optimizer.adamw.weight_decay == 0.01  # the defaults of the others
    changed = typed.replace(optimizer={"lr": 1.0, "muon": {"b1": 0.8}})
    assert (changed.optimizer.lr, changed.optimizer.muon.b1, changed.optimizer.muon.matrix_lr) == (
        1.0,
        0.8,
        0.01,
    )
    with pytest.raises(
        KeyError, match=r"optimizer.muon.matrx_lr is not a config field \(did you mean 'matrix_lr'"
    ):
        from_config_dict({**to_dict(typed), "optimizer": {"muon": {"matrx_lr": 0.1}}})
    with pytest.raises(KeyError, match=r"optimizer.adam is not a config field \(did you mean 'adamw'"):
        from_config_dict({**to_dict(typed), "optimizer": {"adam": {}}})
    with pytest.raises(ValueError, match=r"optimizer.wsd.decay_steps must be int, got 2.5"):
        from_config_dict({**to_dict(typed), "optimizer": {"wsd": {"decay_steps": 2.5}}})
