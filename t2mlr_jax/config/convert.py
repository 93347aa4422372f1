"""The typed experiment (t2mlr_jax.config.sections) in its editable and stored forms: the ml_collections
ConfigDict that config files build and --config.a.b=v overrides edit, and the plain dict written beside
checkpoints (run_config.json) and read back by interop. Reading a config file's ConfigDict back into the
typed experiment is the edge's (t2mlr_jax.experiment.resolve).
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping

from ml_collections import config_dict

from t2mlr_jax.config.sections import CORE, Experiment, Sectioned, recurrence_settings
from t2mlr_jax.model.config import ModelConfig

FREE_FORM = ("options", "eval_options")  # data sub-sections whose keys are the task's, not ours
NOT_EDITABLE = ("recurrence", "mixer_options")  # model sub-objects not edited as fields of `model`


# ---------------------------------------------------------------------------------------------
# The backbone: ModelConfig <-> a JSON-able dict (checkpoints, interop).


def model_to_dict(model: ModelConfig) -> dict:
    return dataclasses.asdict(model)


def model_from_dict(data: Mapping) -> ModelConfig:
    data = dict(data)
    rec = data.pop("recurrence", None)
    _refuse_unknown(ModelConfig, data)
    if rec is not None:
        settings = recurrence_settings()
        _refuse_unknown(settings, rec)
        rec = settings(**rec)
    return ModelConfig(**data, recurrence=rec)


def _refuse_unknown(cls: type, fields: Mapping) -> None:
    unknown = set(fields) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown fields {sorted(unknown)} in the stored config")


# ---------------------------------------------------------------------------------------------
# Experiment -> ConfigDict / dict.


def _fields_dict(instance, skip=()) -> config_dict.ConfigDict:
    """A dataclass as a ConfigDict, the sections it holds as sub-dicts after its fields; Optional fields
    that are None become typed placeholders so that `--config.x=v` can override them from the command
    line."""
    hints = field_hints(type(instance))
    out = config_dict.ConfigDict()
    for field in dataclasses.fields(instance):
        if field.name in skip:
            continue
        value = getattr(instance, field.name)
        if field.name == "sections" and isinstance(instance, Sectioned):
            for name, settings in sorted(value.items()):
                out[name] = _fields_dict(settings)
            continue
        if value is None:
            value = config_dict.placeholder(accepted_types(hints[field.name])[0])
        elif isinstance(value, Mapping):
            value = config_dict.ConfigDict(dict(value))
        out[field.name] = value
    return out


def to_config_dict(experiment: Experiment) -> config_dict.ConfigDict:
    c = config_dict.ConfigDict()
    for name in ("name", "seed", "arch", "init_from", "init_from_required", "compilation_cache"):
        value = getattr(experiment, name)
        c[name] = config_dict.placeholder(str) if value is None else value
    c.model = _fields_dict(experiment.model, NOT_EDITABLE)
    c.model.recurrence = _fields_dict(experiment.model.recurrence or recurrence_settings()(), NOT_EDITABLE)
    for name in CORE:
        c[name] = _fields_dict(getattr(experiment, name))
    for name, settings in sorted(experiment.sections.items()):
        c[name] = _fields_dict(settings)
    return c


def to_dict(experiment: Experiment) -> dict:
    """The whole experiment as plain nested dicts (run_config.json, summaries)."""
    return to_config_dict(experiment).to_dict()


@functools.cache
def field_hints(cls: type) -> dict:
    """A dataclass's field annotations, resolved (cached: read for every field of every section)."""
    return typing.get_type_hints(cls)


def accepted_types(hint) -> tuple:
    """The accepted types of a field's annotation, None dropped (X | None -> (X,))."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return tuple(a for a in typing.get_args(hint) if a is not type(None))
    return (hint,)
