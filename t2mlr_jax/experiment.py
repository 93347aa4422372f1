"""The assembly of an experiment: config files call `experiment(...)` for an ml_collections ConfigDict of
every section's defaults updated by what they set, which presets and --config.a.b=v then edit; main.py
(and anything else that runs one) turns it into the typed `Experiment` with `resolve`.

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

from ml_collections import config_dict

from t2mlr_jax.architectures import arch_names, build_architecture, flops_per_step
from t2mlr_jax.config.convert import from_config_dict, to_config_dict
from t2mlr_jax.config.edit import update_known
from t2mlr_jax.config.sections import Data, Experiment
from t2mlr_jax.model.config import ModelConfig
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
