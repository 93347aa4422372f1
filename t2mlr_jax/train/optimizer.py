"""Optimizers, registered by name (`optimizer.name`; AdamW as the release trains it is `adamw`): HF-style
LR schedules, a weight-decay mask read off the parameter table's kinds, a per-group LR multiplier for the
fusion ("gate") parameters, and global-norm gradient clipping.

The multiplier scales the final AdamW update of the mixer parameters, which is exactly a PyTorch param
group with lr x m (both the Adam step and the decoupled decay are proportional to the group's lr).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax

from t2mlr_jax.model.spec import is_spec
from t2mlr_jax.registry import Registry

SCHEDULES = ("cosine", "wsd", "constant")
GATE_GROUP = "mixer"  # every fusion parameter, as the release's `is_boosted_param_name`


def warmup_steps(opt: ml_collections.ConfigDict, total_steps: int) -> int:
    """HF's rule: ceil(warmup_ratio * total)."""
    return int(math.ceil(opt.warmup_ratio * total_steps))


def make_schedule(opt: ml_collections.ConfigDict, total_steps: int) -> optax.Schedule:
    """Linear warmup from 0, then the body (values of HF's LambdaLR schedules at the same step index).

    cosine:   cosine from lr to min_lr_ratio * lr over the remaining steps (HF cosine_with_min_lr).
    wsd:      constant, then a cosine decay to min_lr_ratio * lr over the last `decay_steps`
              (HF warmup_stable_decay, the release's S5 transformer baseline).
    constant: lr after warmup.
    """
    if opt.schedule not in SCHEDULES:
        raise ValueError(f"optimizer.schedule must be one of {SCHEDULES}, got {opt.schedule!r}")
    peak, floor = float(opt.lr), float(opt.min_lr_ratio)
    warm = warmup_steps(opt, total_steps)
    decay_start = total_steps - int(opt.decay_steps) if opt.schedule == "wsd" else warm
    decay_len = max(total_steps - decay_start, 1)

    def schedule(step):
        step = jnp.asarray(step, jnp.float32)
        ramp = step / max(warm, 1)
        progress = jnp.clip((step - decay_start) / decay_len, 0.0, 1.0)
        cosine = floor + (1.0 - floor) * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
        body = jnp.ones_like(step) if opt.schedule == "constant" else cosine
        return peak * jnp.where(step < warm, ramp, body)

    return schedule


def _path_name(path) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def decay_mask(specs: dict) -> Any:
    """True where weight decay applies, read off each parameter's kind: not on norms, biases or the
    ReZero gammas (the release's rule)."""
    return jax.tree.map(lambda spec: spec.decays, specs, is_leaf=is_spec)


def lr_multipliers(specs: dict, gate_multiplier: float) -> Any:
    """Per-leaf LR multiplier: `gate_multiplier` for the fusion parameters, 1 elsewhere."""
    return jax.tree_util.tree_map_with_path(
        lambda path, _: gate_multiplier if _path_name(path).startswith(GATE_GROUP) else 1.0,
        specs,
        is_leaf=is_spec,
    )


def _scale_by_tree(multipliers: Any) -> optax.GradientTransformation:
    return optax.stateless(lambda updates, params: jax.tree.map(lambda u, m: u * m, updates, multipliers))


OPTIMIZERS = Registry("optimizer")


@OPTIMIZERS.register("adamw")
def adamw(
    opt: ml_collections.ConfigDict, specs: dict, schedule: optax.Schedule
) -> optax.GradientTransformation:
    """AdamW with decoupled decay on the parameters whose kind decays."""
    return optax.adamw(
        schedule, b1=opt.b1, b2=opt.b2, eps=opt.eps, weight_decay=opt.weight_decay, mask=decay_mask(specs)
    )


def make_optimizer(
    opt: ml_collections.ConfigDict, specs: dict, total_steps: int
) -> optax.GradientTransformation:
    """clip -> the registered optimizer `opt.name` (schedule, masks from the parameter table `specs`) ->
    per-group LR multiplier."""
    build = OPTIMIZERS.get(opt.name)
    parts = []
    if opt.grad_clip:
        parts.append(optax.clip_by_global_norm(float(opt.grad_clip)))
    parts.append(build(opt, specs, make_schedule(opt, total_steps)))
    if opt.gate_lr_multiplier != 1.0:
        parts.append(_scale_by_tree(lr_multipliers(specs, float(opt.gate_lr_multiplier))))
    return optax.chain(*parts)
