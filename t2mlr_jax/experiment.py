"""The assembly of an experiment: config files call `experiment(...)` for an ml_collections ConfigDict of
every section's defaults updated by what they set, which presets and --config.a.b=v then edit; main.py
(and anything else that runs one) turns it into the typed `Experiment` with `resolve`: the edge, where every
field is checked against its dataclass (an unknown name or a value of the wrong type is one error naming
the field, with the nearest names) and each dataclass checks itself when built. Nothing below sees a
ConfigDict.

Sections (t2mlr_jax.config.sections holds each one's fields, defaults and checks):
  arch       what to train: a registered architecture (t2mlr | transformer | looped | middle_looped |
             pause | lstm | lrt | ponderlm2 | ...), or a comma list (e.g. "t2mlr,transformer") to train
             each into workdir/<arch> and compare them.
  model      every ModelConfig field, with `model.recurrence` the RecurrenceConfig fields (used by t2mlr).
  <arch>     each registered architecture's own section (its settings dataclass, registered with it).
  baseline   how baselines are sized: `param_match` widens them to the T²MLR model's parameter count.
  optimizer  a registered optimizer (adamw | muon) and schedule (cosine | wsd | constant | linear_decay),
             clipping, gate LR multiplier; each one's own settings under it, e.g. optimizer.muon
             (t2mlr_jax.train.optimizer).
  train      steps (or a FLOP budget), batch, logging / checkpoint cadence.
  data       task name and the task's own settings, or the files / TFDS splits of text.
  eval       loss mode, generation settings, how many examples, the eval rows' length (`window`).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any

from ml_collections import config_dict

from t2mlr_jax.architectures import arch_names, build_architecture, flops_per_step
from t2mlr_jax.config.convert import NOT_EDITABLE, accepted_types, field_hints, to_config_dict
from t2mlr_jax.config.edit import update_known
from t2mlr_jax.config.sections import CORE, Data, Experiment, Sectioned, recurrence_settings, sections_under
from t2mlr_jax.data.tasks import TASKS
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.registry import did_you_mean
from t2mlr_jax.train.optimizer import OPTIMIZERS, SCHEDULES  # (registers them and their sections)


def experiment(
    *,
    name: str,
    model: ModelConfig,
    data: dict,
    optimizer: dict = (),
    train: dict = (),
    evaluation: dict = (),
    baseline: dict = (),
    mesh: dict = (),
    sections: dict = (),
    arch: str = "t2mlr",
    seed: int = 42,
    init_from: str | None = "",
) -> config_dict.ConfigDict:
    """The full config with every section's defaults, updated by what an experiment sets (`sections`: the
    architecture sections, e.g. {"t2mlr": {"forward_mode": "exact"}, "looped": {"repeats": 3}}).
    init_from=None (the finetuning recipes) makes init_from_required."""
    defaults = Experiment(
        name=name,
        model=model,
        arch=arch,
        seed=seed,
        init_from=init_from,
        init_from_required=init_from is None,
        data=Data(kind=dict(data).get("kind", "generated")),  # data.packing's default depends on the kind
    )
    c = to_config_dict(defaults)
    updates = dict(optimizer=optimizer, train=train, eval=evaluation, baseline=baseline, data=data, mesh=mesh)
    update_known(c, {k: dict(v) for k, v in {**updates, **dict(sections)}.items()}, "config")
    return c


def resolve(config: config_dict.ConfigDict) -> Experiment:
    """The typed experiment of a config file's ConfigDict (presets and overrides applied), all checked, with
    its derived values: train.flop_budget's steps when it names one architecture (`for_arch`)."""
    typed = from_config_dict(config)
    OPTIMIZERS.get(typed.optimizer.name)
    SCHEDULES.get(typed.optimizer.schedule)
    names = arch_names(typed) if typed.train.flop_budget else ()
    return for_arch(typed, names[0]) if len(names) == 1 else typed


def for_arch(typed: Experiment, name: str) -> Experiment:
    """The experiment that architecture `name` of `typed.arch` trains: with train.flop_budget, train.steps =
    round(budget / its expected training FLOPs per step) (t2mlr_jax.model.flops), at least 1. `resolve`
    applies it to a config of one architecture, main.py to each of a comma list's (their steps differ);
    nothing after changes the steps."""
    if not typed.train.flop_budget:
        return typed
    per_step = flops_per_step(typed, build_architecture(typed, name))
    if per_step is None:
        raise ValueError(f"train.flop_budget: architecture {name!r} has no training FLOP accounting")
    return typed.replace(train={"steps": max(1, round(typed.train.flop_budget / per_step))})


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
    recurrence = build(recurrence_settings(), model.pop("recurrence", {}), "model.recurrence")
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


def _checked(cls: type, name: str, value: Any, where: str) -> Any:
    hint = field_hints(cls)[name]
    optional = type(None) in typing.get_args(hint)
    if value is None and optional:
        return None
    for kind in accepted_types(hint):
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
    shown = " or ".join(getattr(k, "__name__", str(k)) for k in accepted_types(hint))
    raise ValueError(f"{where} must be {shown}{' or None' if optional else ''}, got {value!r}")
