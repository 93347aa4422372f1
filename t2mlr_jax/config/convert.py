"""The one conversion between the typed experiment (t2mlr_jax.config.sections) and its editable and stored
forms: the ml_collections ConfigDict that config files build and --config.a.b=v overrides edit, and the
plain dict written beside checkpoints (run_config.json) and read back by interop.

Reading a ConfigDict back checks every field against its dataclass: an unknown name or a value of the
wrong type is one error naming the field, with the nearest names.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping
from typing import Any

from ml_collections import config_dict

from t2mlr_jax.config.sections import CORE, Data, Experiment, Sectioned, sections_under
from t2mlr_jax.data.tasks import TASKS
from t2mlr_jax.model.config import ModelConfig, RecurrenceConfig
from t2mlr_jax.registry import did_you_mean

FREE_FORM = ("options", "eval_options")  # data sub-sections whose keys are the task's, not ours
NOT_EDITABLE = ("recurrence", "mixer_options")  # model sub-objects not edited as fields of `model`


# ---------------------------------------------------------------------------------------------
# The backbone: ModelConfig <-> a JSON-able dict (checkpoints, interop).


def model_to_dict(model: ModelConfig) -> dict:
    return dataclasses.asdict(model)


def model_from_dict(data: Mapping) -> ModelConfig:
    data = dict(data)
    rec = data.pop("recurrence", None)
    for cls, fields in ((ModelConfig, data), (RecurrenceConfig, rec or {})):
        unknown = set(fields) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown fields {sorted(unknown)} in the stored config")
    return ModelConfig(**data, recurrence=None if rec is None else RecurrenceConfig(**rec))


# ---------------------------------------------------------------------------------------------
# Experiment -> ConfigDict / dict.


def _fields_dict(instance, skip=()) -> config_dict.ConfigDict:
    """A dataclass as a ConfigDict, the sections it holds as sub-dicts after its fields; Optional fields
    that are None become typed placeholders so that `--config.x=v` can override them from the command
    line."""
    hints = _hints(type(instance))
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
            value = config_dict.placeholder(_plain(hints[field.name])[0])
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
    c.model.recurrence = _fields_dict(experiment.model.recurrence or RecurrenceConfig(), NOT_EDITABLE)
    for name in CORE:
        c[name] = _fields_dict(getattr(experiment, name))
    for name, settings in sorted(experiment.sections.items()):
        c[name] = _fields_dict(settings)
    return c


def to_dict(experiment: Experiment) -> dict:
    """The whole experiment as plain nested dicts (run_config.json, summaries)."""
    return to_config_dict(experiment).to_dict()


# ---------------------------------------------------------------------------------------------
# ConfigDict -> Experiment, every field checked.


def from_config_dict(config: config_dict.ConfigDict | Mapping) -> Experiment:
    values = config.to_dict() if isinstance(config, config_dict.ConfigDict) else dict(config)
    known = {f.name for f in dataclasses.fields(Experiment)} - {"sections"}
    top_sections = sections_under("")
    unknown = [k for k in values if k not in known and k not in CORE and k not in top_sections]
    if unknown:
        raise KeyError(
            f"{unknown[0]} is not a config section{did_you_mean(unknown[0], [*known, *top_sections])}"
        )
    model = dict(values.pop("model"))
    recurrence = build(RecurrenceConfig, model.pop("recurrence", {}), "model.recurrence")
    model = build(ModelConfig, model, "model", skip=NOT_EDITABLE, recurrence=recurrence)
    sections = {name: build(cls, values.pop(name, {}), name) for name, cls in top_sections.items()}
    core = {name: build(cls, values.pop(name, {}), name) for name, cls in CORE.items()}
    _check_task_options(core["data"])
    top = {k: _checked(Experiment, k, v, k) for k, v in values.items()}
    return Experiment(model=model, sections=sections, **core, **top)


def _check_task_options(data: Data) -> None:
    """A generated task's options are the fields of its generator's settings dataclass: checked like a
    section's (names, types, then the dataclass's own checks), for both splits. A task name that is not
    registered is left to the data source the run is given (the built-in ones refuse it by name)."""
    if data.kind != "generated" or data.task not in TASKS:
        return
    spec = TASKS[data.task]
    for split, options, where in (
        ("train", data.options, "data.options"),
        (data.eval_split, {**data.options, **data.eval_options}, "data.eval_options"),
    ):
        build(spec.config_cls, spec.fields(split, options), where)


def build(cls: type, values: Mapping, where: str, skip=(), **given):
    """`cls(**values, **given)`, each value checked against the field's type, and each registered section
    under it built likewise from its sub-dict; unknown names are one error. `given`: fields (of `skip`)
    passed as they are."""
    values = dict(values)
    inner = sections_under(cls.PARENT) if issubclass(cls, Sectioned) else {}
    names = [f.name for f in dataclasses.fields(cls) if f.name not in (*skip, "sections")]
    for key in values:
        if key not in names and key not in inner:
            known = [*names, *inner]
            raise KeyError(f"{where}.{key} is not a config field{did_you_mean(key, known)}; known: {known}")
    sections = {name: build(cls_, values.pop(name, {}), f"{where}.{name}") for name, cls_ in inner.items()}
    kwargs = {**{k: _checked(cls, k, v, f"{where}.{k}") for k, v in values.items()}, **given}
    return cls(**kwargs, sections=sections) if issubclass(cls, Sectioned) else cls(**kwargs)


@functools.cache
def _hints(cls: type) -> dict:
    return typing.get_type_hints(cls)


def _plain(hint) -> tuple:
    """The accepted types of a field's annotation, None dropped (X | None -> (X,))."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return tuple(a for a in typing.get_args(hint) if a is not type(None))
    return (hint,)


def _checked(cls: type, name: str, value: Any, where: str) -> Any:
    hint = _hints(cls)[name]
    optional = type(None) in typing.get_args(hint)
    if value is None and optional:
        return None
    for kind in _plain(hint):
        origin = typing.get_origin(kind) or kind
        if origin is Any:
            return value
        if origin is float and isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if origin is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if origin in (str, bool) and isinstance(value, origin):
            return value
        if origin is tuple and isinstance(value, tuple | list):
            return tuple(value)
        if origin in (Mapping, dict) and isinstance(value, Mapping):
            return dict(value)
        if dataclasses.is_dataclass(origin) and isinstance(value, origin):
            return value
    shown = " or ".join(getattr(k, "__name__", str(k)) for k in _plain(hint))
    raise ValueError(f"{where} must be {shown}{' or None' if optional else ''}, got {value!r}")
