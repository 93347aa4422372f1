"""Optimizers, registered by name (`optimizer.name`): `adamw` (AdamW as the T²MLR release trains it) and
`muon` (nanochat's MuonAdamW: Muon on the matrices, Adam on the rest, groups read off the parameter kinds).
LR schedules, registered by name (`optimizer.schedule`): HF's cosine, warmup-stable-decay and constant,
and nanochat's `linear_decay`. Each optimizer or schedule with settings of its own registers them as a
frozen dataclass, its config section under `optimizer` (optimizer.adamw, optimizer.muon, optimizer.wsd).
Also: a weight-decay mask read off the parameter table's kinds, a per-group LR multiplier for the fusion
("gate") parameters, global-norm clipping, and frozen parameters (`ParamSpec.frozen`) that never move.

The multiplier scales the final update of the mixer parameters, which is exactly a PyTorch param group
with lr x m (both the step and the decoupled decay are proportional to the group's lr).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from t2mlr_jax.config.sections import Optimizer, non_negative_rates, one_of, register_section
from t2mlr_jax.model import layer_layout
from t2mlr_jax.model.spec import ParamSpec, is_spec
from t2mlr_jax.registry import Registry
from t2mlr_jax.train import muon as stacked_muon
from t2mlr_jax.train.muon import NS_DTYPES

GATE_GROUP = "mixer"  # every fusion parameter, as the release's `is_boosted_param_name`


def warmup_steps(opt: Optimizer, total_steps: int) -> int:
    """HF's rule: ceil(warmup_ratio * total)."""
    return int(math.ceil(opt.warmup_ratio * total_steps))


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A schedule after its linear warmup: the peak lr until `decay_start(opt, total, warmup)`, then
    lr x `decay(progress, min_lr_ratio)` as progress runs from 0 to 1 over the remaining steps."""

    decay_start: Callable[[Optimizer, int, int], int]
    decay: Callable[[jax.Array, float], jax.Array]


SCHEDULES = Registry("schedule")


def _register(registry: Registry, name: str, entry, settings: type | None) -> None:
    """`entry` under `name`; `settings`, a frozen dataclass, becomes its section optimizer.<name>."""
    if settings is not None:
        register_section(f"optimizer.{name}", settings)
    registry.register(name, entry)


def register_schedule(name: str, schedule: Schedule, settings: type | None = None) -> None:
    _register(SCHEDULES, name, schedule, settings)


def _cosine(progress, floor):
    return floor + (1.0 - floor) * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))


def _after_warmup(opt, total, warm):
    return warm


@dataclasses.dataclass(frozen=True)
class WSD:
    decay_steps: int = 0  # the cosine decay's length, at the end of training


@dataclasses.dataclass(frozen=True)
class LinearDecay:
    decay_ratio: float = 0.5  # the final fraction of steps that decays (nanochat)

    def __post_init__(self):
        if not 0.0 <= self.decay_ratio <= 1.0:
            raise ValueError(f"optimizer.linear_decay.decay_ratio must be in [0, 1], got {self.decay_ratio}")


# HF cosine_with_min_lr: cosine from lr to min_lr_ratio x lr over the steps after warmup.
register_schedule("cosine", Schedule(_after_warmup, _cosine))
# HF warmup_stable_decay (the release's S5 transformer baseline): constant, then the cosine over the last
# optimizer.wsd.decay_steps.
register_schedule("wsd", Schedule(lambda opt, total, warm: total - opt.wsd.decay_steps, _cosine), WSD)
register_schedule("constant", Schedule(_after_warmup, lambda progress, floor: jnp.ones_like(progress)))
# nanochat's warmdown: constant, then linear to min_lr_ratio x lr over the last round(decay_ratio x total)
# steps (nanochat: decay_ratio 0.5, to 0, no warmup).
register_schedule(
    "linear_decay",
    Schedule(
        lambda opt, total, warm: total - round(opt.linear_decay.decay_ratio * total),
        lambda progress, floor: 1.0 - (1.0 - floor) * progress,
    ),
    LinearDecay,
)


def make_schedule(opt: Optimizer, total_steps: int) -> optax.Schedule:
    """Linear warmup from 0, then the registered schedule `opt.schedule` (the values of HF's LambdaLR
    schedules at the same step index), peaking at lr x lr_multiplier (muon's groups scale by schedule / lr,
    so the multiplier reaches every one of them)."""
    shape = SCHEDULES.get(opt.schedule)
    peak, floor = float(opt.lr) * float(opt.lr_multiplier), float(opt.min_lr_ratio)
    warm = warmup_steps(opt, total_steps)
    decay_start = shape.decay_start(opt, total_steps, warm)
    decay_len = max(total_steps - decay_start, 1)

    def schedule(step):
        step = jnp.asarray(step, jnp.float32)
        ramp = step / max(warm, 1)
        progress = jnp.clip((step - decay_start) / decay_len, 0.0, 1.0)
        return peak * jnp.where(step < warm, ramp, shape.decay(progress, floor))

    return schedule


def _path_name(path) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def decay_mask(specs: dict) -> Any:
    """True where weight decay applies, read off each parameter's kind: not on norms, biases or the
    ReZero gammas (the release's rule)."""
    return jax.tree.map(lambda spec: spec.decays, specs, is_leaf=is_spec)


def frozen_mask(specs: dict) -> Any:
    """True at the parameters the optimizer never updates (`ParamSpec.frozen`)."""
    return jax.tree.map(lambda spec: spec.frozen, specs, is_leaf=is_spec)


def lr_multipliers(specs: dict, gate_multiplier: float) -> Any:
    """Per-leaf LR multiplier: `gate_multiplier` for the fusion parameters, 1 elsewhere."""
    return jax.tree_util.tree_map_with_path(
        lambda path, _: gate_multiplier if _path_name(path).startswith(GATE_GROUP) else 1.0,
        specs,
        is_leaf=is_spec,
    )


def _scale_by_tree(multipliers: Any) -> optax.GradientTransformation:
    return optax.stateless(lambda updates, params: jax.tree.map(lambda u, m: u * m, updates, multipliers))


CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s, which the release's HF Trainer calls


def clip_by_global_norm(max_norm: float, norm_given: bool = True) -> optax.GradientTransformationExtraArgs:
    """The release's clip (torch's `clip_grad_norm_`): every gradient times min(1, max_norm / (norm + 1e-6)).
    One scalar multiply, which XLA fuses into the optimizer's update; optax's select-and-divide is
    materialised as a clipped copy of every gradient (one more pass over the model's size per step). With
    `norm_given`, the global norm the train step already took (extra argument `grad_norm`) is used rather
    than a second pass over the gradients; without it (or the argument), the norm of what reaches the clip."""

    def update(updates, state, params=None, *, grad_norm=None, **extra):
        norm = grad_norm if norm_given and grad_norm is not None else optax.tree.norm(updates)
        scale = jnp.minimum(1.0, max_norm / (norm + CLIP_EPS))
        return jax.tree.map(lambda g: g * scale.astype(g.dtype), updates), state

    return optax.GradientTransformationExtraArgs(lambda params: optax.EmptyState(), update)


OPTIMIZERS = Registry("optimizer")


def register_optimizer(name: str, build: Callable, settings: type | None = None) -> None:
    """Register `build(optimizer section, specs, schedule, total_steps) -> optax.GradientTransformation`
    under `name`; `settings`, a frozen dataclass, becomes its section optimizer.<name>."""
    _register(OPTIMIZERS, name, build, settings)


@dataclasses.dataclass(frozen=True)
class AdamW:
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.01  # decoupled, on the kinds that decay


def adamw(
    opt: Optimizer, specs: dict, schedule: optax.Schedule, total_steps: int
) -> optax.GradientTransformation:
    """AdamW with decoupled decay on the parameters whose kind decays."""
    a = opt.adamw
    return optax.adamw(
        schedule, b1=a.b1, b2=a.b2, eps=a.eps, weight_decay=a.weight_decay, mask=decay_mask(specs)
    )


register_optimizer("adamw", adamw, AdamW)


# --- muon: nanochat's MuonAdamW -------------------------------------------------------------------------
# Groups are read off the parameter kinds only (never names): kind -> group.
MUON_GROUPS = {
    "matrix": "muon",
    "embedding": "embedding",
    "head": "head",
    "norm": "scalar",
    "bias": "scalar",
    "gate": "scalar",
    "scalar": "scalar",
    "residual": "residual",
    "skip": "skip",
}
REFERENCE_WIDTH = 768  # nanochat's d_model at which embedding_lr / head_lr are tuned: lr x (d / 768) ** -0.5
REFERENCE_DEPTH = 12  # ... and its depth: Muon weight decay x (12 / num_layers) ** 2
REFERENCE_BATCH_TOKENS = 2**19  # ... and its batch: every lr x sqrt(batch_tokens / 2**19)
ADAM_EPS = 1e-10
SKIP_BETAS = (0.96, 0.95)  # the x0 lambdas (kind "skip")
RESIDUAL_LR_SCALE = 0.01  # the resid lambdas (kind "residual"): scalar_lr x 0.01
NS_STEPS = 5  # Newton-Schulz steps (optax's default; nanochat's Polar Express table is fitted for 5)
MUON_VARIANTS = ("optax", "nanochat")  # optimizer.muon.variant
DECAY_SCHEDULES = ("constant", "linear")  # optimizer.muon.decay_schedule


@dataclasses.dataclass(frozen=True)
class Muon:
    """nanochat's MuonAdamW: every lr x sqrt(batch_tokens / 2**19) x schedule / optimizer.lr."""

    matrix_lr: float = 0.02  # Muon lr of the "matrix" kind
    embedding_lr: float = 0.3  # Adam lr of the "embedding" kind, x (d_model / 768) ** -0.5
    head_lr: float = 0.004  # Adam lr of the "head" kind, x (d_model / 768) ** -0.5
    scalar_lr: float = 0.5  # Adam lr of scalar / gate / norm / bias / skip; residual: x 0.01
    b1: float = 0.9  # the Adam groups' betas (nanochat's recipe 0.8, 0.95)
    b2: float = 0.95
    weight_decay: float = 0.01  # the matrices' only, x (12 / layers)^2
    # the depth `layers` that rule reads: 0 = the model's own (nanochat); fixed, every depth of a comparison
    # decays alike (at 12: weight_decay as given)
    decay_depth: int = 0
    momentum_start: float = 0.85  # Muon momentum, linear from start to end over the first warmup steps
    momentum_end: float = 0.95
    momentum_warmup_steps: int = 300
    batch_tokens: int = 0  # tokens per step (train.batch_size x data.seq_len); 0 = no batch scaling
    # the dtype the Newton-Schulz iterations store their iterate in (products accumulate in fp32):
    # "bfloat16" (nanochat's and the reference Muon's) or "float32" (optax's update, to round-off)
    ns_dtype: str = "bfloat16"
    # the matrices' step: "optax" (optax.contrib.scale_by_muon's update, plain decoupled decay) or "nanochat"
    # (its MuonAdamW's: Polar Express, NorMuon, cautious decay; `muon`'s docstring has the differences)
    variant: str = "optax"
    beta2: float = 0.95  # the nanochat variant's NorMuon second-moment decay (setup_optimizer's)
    # the matrices' decay over the run: "constant", or "linear" to 0 at train.steps (weight_decay x
    # (1 - step / steps), nanochat base_train's get_weight_decay), besides the lr's schedule
    decay_schedule: str = "constant"

    def __post_init__(self):
        non_negative_rates("optimizer.muon", self)
        one_of("optimizer.muon.ns_dtype", self.ns_dtype, NS_DTYPES)
        one_of("optimizer.muon.variant", self.variant, MUON_VARIANTS)
        one_of("optimizer.muon.decay_schedule", self.decay_schedule, DECAY_SCHEDULES)
        for field in ("momentum_start", "momentum_end", "b1", "b2", "beta2"):
            if not 0.0 <= float(getattr(self, field)) < 1.0:
                raise ValueError(f"optimizer.muon.{field} must be in [0, 1), got {getattr(self, field)}")
        for field in ("weight_decay", "batch_tokens", "momentum_warmup_steps", "decay_depth"):
            if getattr(self, field) < 0:
                raise ValueError(f"optimizer.muon.{field} must be >= 0, got {getattr(self, field)}")


# nanochat's recipe as preset entries (a config's presets: `{"muon": MUON_RECIPE}`) over the defaults.
# lr = 1: under muon `optimizer.lr` only normalises the schedule, so the logged "lr" is the LR multiplier.
MUON_RECIPE = {
    "optimizer.name": "muon",
    "optimizer.lr": 1.0,
    "optimizer.muon.b1": 0.8,
    "optimizer.muon.b2": 0.95,
    "optimizer.muon.weight_decay": 0.2,
    "optimizer.muon.variant": "nanochat",
    "optimizer.muon.decay_schedule": "linear",
    "optimizer.schedule": "linear_decay",
    "optimizer.warmup_ratio": 0.0,
    "optimizer.min_lr_ratio": 0.0,
    "optimizer.linear_decay.decay_ratio": 0.5,
    "optimizer.grad_clip": 0.0,  # nanochat does not clip
}


def muon_labels(specs: dict) -> Any:
    """The group of every parameter (a tree shaped like the params), read off its kind."""
    return jax.tree.map(lambda spec: MUON_GROUPS[spec.kind], specs, is_leaf=is_spec)


def _axis_sizes(specs: dict, kinds: tuple[str, ...], axis: str) -> set[int]:
    """The sizes of logical axis `axis` over the parameters of these kinds."""
    return {
        size
        for spec in jax.tree.leaves(specs, is_leaf=is_spec)
        if spec.kind in kinds
        for size, name in zip(spec.shape, spec.axes)
        if name == axis
    }


def muon_width(specs: dict) -> int | None:
    """d_model: the size of the `embed` axis of the vocabulary tables (kinds embedding / head); None if no
    table has one."""
    widths = _axis_sizes(specs, ("embedding", "head"), "embed")
    if len(widths) > 1:
        raise ValueError(
            f"muon: the vocabulary tables disagree on d_model (their embed axes: {sorted(widths)})"
        )
    return widths.pop() if widths else None


def muon_depth(specs: dict) -> int:
    """num_layers: the largest `layers` axis of the matrices (1 when no matrix is stacked over layers)."""
    return max(_axis_sizes(layer_layout.stacked(specs), ("matrix",), "layers"), default=1)


def muon_batch_scale(m: Muon) -> float:
    """nanochat's batch scaling of every lr: sqrt(batch_tokens / 2**19); 1 when batch_tokens is 0."""
    tokens = float(m.batch_tokens)
    return math.sqrt(tokens / REFERENCE_BATCH_TOKENS) if tokens else 1.0


def muon_group_lrs(m: Muon, specs: dict) -> dict[str, float]:
    """The peak lr of every group present in `specs` (before the schedule's multiplier): matrix_lr (muon),
    embedding_lr and head_lr x (d_model / 768) ** -0.5, scalar_lr (scalar, skip), scalar_lr x 0.01
    (residual); all x the batch scale."""
    present = set(jax.tree.leaves(muon_labels(specs)))
    width = muon_width(specs) if present & {"embedding", "head"} else None
    if present & {"embedding", "head"} and width is None:
        raise ValueError("muon: no embedding / head table has an 'embed' axis to read d_model from")
    width_scale = (width / REFERENCE_WIDTH) ** -0.5 if width else 1.0
    lrs = {
        "muon": float(m.matrix_lr),
        "embedding": float(m.embedding_lr) * width_scale,
        "head": float(m.head_lr) * width_scale,
        "scalar": float(m.scalar_lr),
        "residual": float(m.scalar_lr) * RESIDUAL_LR_SCALE,
        "skip": float(m.scalar_lr),
    }
    batch = muon_batch_scale(m)
    return {group: lr * batch for group, lr in lrs.items() if group in present}


def muon_weight_decay(m: Muon, specs: dict) -> float:
    """The Muon matrices' decoupled decay (x the lr, so it anneals with the schedule):
    weight_decay x (12 / num_layers) ** 2, num_layers = decay_depth when set."""
    return float(m.weight_decay) * (REFERENCE_DEPTH / (m.decay_depth or muon_depth(specs))) ** 2


def muon_decay(m: Muon, specs: dict, total_steps: int) -> float | optax.Schedule:
    """`muon_weight_decay` over the run, as decay_schedule says: constant, or "linear": x (1 - n /
    total_steps) at update n (from 0), 0 from total_steps on."""
    decay = muon_weight_decay(m, specs)
    if decay and m.decay_schedule == "linear":
        return optax.linear_schedule(decay, 0.0, max(int(total_steps), 1))
    return decay


def momentum_schedule(m: Muon) -> optax.Schedule:
    """Muon's momentum: linear from momentum_start to momentum_end over momentum_warmup_steps, then flat."""
    start, end, steps = float(m.momentum_start), float(m.momentum_end), int(m.momentum_warmup_steps)
    if steps == 0:
        return lambda step: jnp.full((), end, jnp.float32)
    return lambda step: start + (end - start) * jnp.clip(jnp.asarray(step, jnp.float32) / steps, 0.0, 1.0)


def _on_matrices(specs: dict, fn) -> Any:
    """fn(path, spec) at the matrices, optax's MaskedNode elsewhere: the structure the muon group's
    transforms see inside `multi_transform`."""
    return jax.tree_util.tree_map_with_path(
        lambda path, spec: fn(path, spec) if spec.kind == "matrix" else optax.transforms.MaskedNode(),
        specs,
        is_leaf=is_spec,
    )


def _dimension_numbers(path, spec: ParamSpec) -> optax.contrib.MuonDimensionNumbers:
    if not spec.fan_in or not spec.fan_out:
        raise ValueError(
            f"muon: matrix {_path_name(path)} {spec.shape} needs fan-in and fan-out dims, "
            f"got fan_in={spec.fan_in} fan_out={spec.fan_out} (in_dims={spec.in_dims})"
        )
    return optax.contrib.MuonDimensionNumbers(reduction_axis=spec.fan_in, output_axis=spec.fan_out)


def _shape_scale(path, spec: ParamSpec) -> float:
    fan_in = math.prod(spec.shape[i] for i in spec.fan_in)
    fan_out = math.prod(spec.shape[i] for i in spec.fan_out)
    return math.sqrt(max(1.0, fan_out / fan_in))


def _orthogonalise(m: Muon, specs: dict) -> optax.GradientTransformation:
    """`m.variant`'s step up to the shape scale: train/muon.py's scale_by_muon or scale_by_nanochat_muon, its
    momentum from `momentum_schedule`."""
    nanochat = m.variant == "nanochat"
    transform = stacked_muon.scale_by_nanochat_muon if nanochat else stacked_muon.scale_by_muon
    static = ("ns_steps", "ns_dtype", "beta2") if nanochat else ("ns_steps", "ns_dtype")
    return optax.inject_hyperparams(transform, static_args=static, hyperparam_dtype=jnp.float32)(
        ns_steps=NS_STEPS,
        beta=momentum_schedule(m),
        weight_dimension_numbers=_on_matrices(specs, _dimension_numbers),
        ns_dtype=m.ns_dtype,
        **({"beta2": float(m.beta2)} if nanochat else {}),
    )


def _shape_scaled(specs: dict) -> optax.GradientTransformation:
    return _scale_by_tree(_on_matrices(specs, _shape_scale))


def scale_by_muon(m: Muon, specs: dict) -> optax.GradientTransformation:
    """Nesterov momentum (warmed up by `momentum_schedule`), orthogonalised by 5 Newton-Schulz steps over
    each matrix's (fan_in, fan_out) dims in `m.ns_dtype` (stacked layer / expert axes are batch axes: one
    orthogonalisation per layer / expert; the matrices of one shape iterate together: train/muon.py; the
    nanochat variant's Polar Express, then NorMuon), then x sqrt(max(1, fan_out / fan_in)) (nanochat / Keller
    Jordan's shape scale). Inside `multi_transform`: the other groups' leaves are MaskedNodes."""
    return optax.chain(_orthogonalise(m, specs), _shape_scaled(specs))


def cautious_weight_decay(weight_decay: float | optax.Schedule) -> optax.GradientTransformation:
    """nanochat's "cautious" decay: u + weight_decay x p only where u x p >= 0, i.e. where the step (-lr u)
    already moves the weight towards 0; elsewhere u alone. A schedule is read at the update's count (its
    state, as optax.add_decayed_weights keeps one for a schedule)."""
    scheduled = callable(weight_decay)

    def init(params):
        return optax.ScaleByScheduleState(jnp.zeros([], jnp.int32)) if scheduled else optax.EmptyState()

    def update(updates, state, params):
        rate = weight_decay(state.count) if scheduled else weight_decay
        decayed = lambda u, p: jnp.where(u * p >= 0, u + rate * p, u)
        new_state = optax.ScaleByScheduleState(optax.safe_increment(state.count)) if scheduled else state
        return jax.tree.map(decayed, updates, params), new_state

    return optax.GradientTransformation(init, update)


def muon_matrix_update(m: Muon, specs: dict, total_steps: int) -> list[optax.GradientTransformation]:
    """The muon group's transforms before its lr: "optax": `scale_by_muon`, then plain decoupled decay
    `muon_weight_decay` x p (the chain, and so the state, this group has always had); "nanochat": its step,
    cautious decay, then the shape scale (nanochat's lr x sqrt(max(1, rows / cols)) scales its decay too).
    Either decays as `muon_decay` says."""
    decay = muon_decay(m, specs, total_steps)
    if m.variant == "nanochat":
        return [
            _orthogonalise(m, specs),
            *([cautious_weight_decay(decay)] if decay else []),
            _shape_scaled(specs),
        ]
    return [scale_by_muon(m, specs), *([optax.add_decayed_weights(decay)] if decay else [])]


def muon(
    opt: Optimizer, specs: dict, schedule: optax.Schedule, total_steps: int
) -> optax.GradientTransformation:
    """nanochat's MuonAdamW. Groups by kind (`MUON_GROUPS`): matrix -> Muon (`muon_matrix_update`, its
    decay `muon_weight_decay` x lr); embedding, head, scalar (+ norm, bias, gate), residual, skip -> Adam
    (betas b1, b2; skip (0.96, 0.95); eps 1e-10; no decay), each at its lr from `muon_group_lrs` x the
    schedule's multiplier schedule(step) / optimizer.lr (any schedule; nanochat's is `linear_decay`).

    optimizer.muon.variant "nanochat" (`MUON_RECIPE`'s) is nanochat's step: Nesterov momentum without bias
    correction, Polar Express on x / (|x|_F * 1.02 + 1e-6), NorMuon (optimizer.muon.beta2) and cautious
    decay, decay included in the shape scale (tests/train/test_stacked_muon.py checks it against the
    release's own MuonAdamW); with decay_schedule "linear" (`MUON_RECIPE`'s) the decay anneals as
    (1 - step / steps) besides the lr, as base_train's get_weight_decay does. Differences from nanochat: its
    Newton-Schulz rounds every product to bf16, ours accumulates in fp32 and rounds the iterate once a step
    (ns_dtype).
    Differences of the "optax" variant (the dataclass default, the state of earlier checkpoints): optax's
    Nesterov momentum is bias-corrected, the Newton-Schulz uses optax's quintic coefficients on
    x / (|x|_F + 1e-8), no variance reduction, and the decay is plain decoupled decay after the shape
    scale."""
    if float(opt.lr) <= 0:
        raise ValueError(
            f"optimizer.lr must be > 0 for muon (schedule / lr is the LR multiplier), got {opt.lr}"
        )
    unknown = {spec.kind for spec in jax.tree.leaves(specs, is_leaf=is_spec)} - set(MUON_GROUPS)
    if unknown:
        raise ValueError(f"muon has no group for parameter kinds {sorted(unknown)}")
    peak = float(opt.lr)
    transforms = {}
    for group, lr in muon_group_lrs(opt.muon, specs).items():
        group_lr = lambda step, lr=lr: lr * schedule(step) / peak
        if group == "muon":
            parts = muon_matrix_update(opt.muon, specs, total_steps)
            transforms[group] = optax.chain(*parts, optax.scale_by_learning_rate(group_lr))
        else:
            b1, b2 = SKIP_BETAS if group == "skip" else (float(opt.muon.b1), float(opt.muon.b2))
            transforms[group] = optax.adam(group_lr, b1=b1, b2=b2, eps=ADAM_EPS)
    return optax.multi_transform(transforms, muon_labels(specs))


register_optimizer("muon", muon, Muon)


def skip_unused(
    inner: optax.GradientTransformation, norms_given: bool = True
) -> optax.GradientTransformationExtraArgs:
    """PyTorch's optimizers skip a parameter whose gradient is None (not used in the step); optax's keep
    stepping along its momentum on a zero gradient. This gives a parameter leaf whose whole gradient is
    zero (one the step did not use: the LRT's thought-slot scalars on a step drawing K = 0) no update and
    its optimizer state as it was. A state leaf belongs to the parameter whose path ends its own and whose
    shape it has, or factors (size 1 on some axes: NorMuon's second moment); counts and other state advance
    as before. A used leaf's whole
    gradient is exactly zero only behind a zero-initialised projection or gate, until that has moved (a step
    or two): its moments are still zero then, so it loses only those steps' decoupled decay.

    With `norms_given`, a leaf is used where its squared norm, which the train step took for the global norm
    (extra argument `grad_sq_norms`, a tree like the gradient's), is > 0, rather than in one more pass over
    every gradient; the two differ only for a gradient all of whose entries are below ~1e-19 in magnitude,
    whose squares underflow. Without it (or the argument), where any entry of what reaches it is nonzero."""

    def update(updates, state, params=None, *, grad_sq_norms=None, **extra):
        new_updates, new_state = inner.update(updates, state, params)
        grads = dict(jax.tree_util.tree_flatten_with_path(updates)[0])
        if norms_given and grad_sq_norms is not None:
            used = {path: n > 0 for path, n in jax.tree_util.tree_flatten_with_path(grad_sq_norms)[0]}
        else:
            used = {path: jnp.any(g != 0) for path, g in grads.items()}

        def of(param, leaf) -> bool:
            shape = grads[param].shape
            return len(shape) == leaf.ndim and all(n in (1, m) for n, m in zip(leaf.shape, shape))

        def keep(path, new, old):
            owners = [p for p in grads if tuple(path[-len(p) :]) == p and of(p, new)]
            return jnp.where(used[max(owners, key=len)], new, old) if owners else new

        new_state = jax.tree_util.tree_map_with_path(keep, new_state, state)
        new_updates = jax.tree_util.tree_map_with_path(
            lambda path, u: jnp.where(used[path], u, jnp.zeros_like(u)), new_updates
        )
        return new_updates, new_state

    return optax.GradientTransformationExtraArgs(inner.init, update)


def make_optimizer(opt: Optimizer, specs: dict, total_steps: int) -> optax.GradientTransformation:
    """clip -> the registered optimizer `opt.name` (schedule, masks from the parameter table `specs`; a
    parameter the step did not use left as it was, `skip_unused`) -> per-group LR multiplier. Frozen
    parameters' gradients are zeroed before the clip (so they stay out of the global norm) and their updates
    after the optimizer (so decoupled decay never moves them); with none frozen the chain is unchanged."""
    build = OPTIMIZERS.get(opt.name)
    frozen = frozen_mask(specs)
    freeze = [optax.masked(optax.set_to_zero(), frozen)] if any(jax.tree.leaves(frozen)) else []
    parts = [*freeze]
    if opt.grad_clip:
        parts.append(clip_by_global_norm(float(opt.grad_clip), norm_given=not freeze))  # frozen: not in it
    inner = build(opt, specs, make_schedule(opt, total_steps), total_steps)
    parts.append(skip_unused(inner, norms_given=not freeze))
    if opt.gate_lr_multiplier != 1.0:
        parts.append(_scale_by_tree(lr_multipliers(specs, float(opt.gate_lr_multiplier))))
    return optax.chain(*parts, *freeze)
