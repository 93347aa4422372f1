"""The architecture contract: everything the trainer, evaluation, generation and main.py know about a model.

An `Architecture` is built from the experiment config by a builder registered under its name in
`ARCHITECTURES`. It carries its parameter table (`specs`: one ParamSpec per parameter, from which init,
sharding, counts and optimizer masks are read), a pure `apply`, its `loss` (default: masked next-token
cross-entropy), a cached `generate`, and optional non-gradient state (`model_state`) with its update.

    apply(params, batch, *, training, rng, model_state, sample=None) -> Outputs
    loss(outputs, batch) -> {"loss": (sum, count), <metric>: (sum, count), ...}   # means = sum / count
    generate(params, model_state, prompt_tokens, prompt_mask, prompt_control_flow,
             max_new_tokens, eos_id, pad_id, sampling=GREEDY, key=None) -> GenerateOutput
    update_model_state(model_state, stats) -> (model_state, metrics)   # after each step, no gradient

`sample(seed, step)` is an optional per-step static choice, a NamedTuple (T²MLR: the Jacobi depth D; the
LRT: its thought count K and passes P): the trainer compiles one step per distinct value, passes it to
`apply` as `sample` and logs its fields. `train_flops(seq_len)` is the expected training FLOPs of a row
(FLOP-matched budgets). What else an architecture can do is its registration's `Capabilities`; where its
weights start is the run's (config.init_from: t2mlr_jax.train.init_from), not the model's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable
from typing import Any, Protocol, runtime_checkable

import flax.struct
import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, Float, Int

from t2mlr_jax.config.sections import SECTIONS, Experiment, register_section
from t2mlr_jax.model import layer_layout
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.control_flow import RECURRENT
from t2mlr_jax.model.generate import GREEDY, Decoder, GenerateOutput, Sampling, generate_with
from t2mlr_jax.model.layers import MLPS
from t2mlr_jax.model.spec import count_specs, init_from_specs
from t2mlr_jax.model.token_layout import Layout
from t2mlr_jax.registry import Registry


@flax.struct.dataclass
class Outputs:
    """What `apply` returns. `logits` is the prediction the loss and the metrics read; `pass_logits` holds
    the logits of earlier refinement passes for losses that average over passes; `aux_losses` are scalars
    the default loss adds (each weighted by the batch's token count); `token_stats` are per-token
    activations ([B, T]) logged as their mean over recurrent positions; `stats` are scalars or arrays
    summed over micro-batches and given to `update_model_state` (and logged when scalar)."""

    logits: Float[Array, "B T V"]
    pass_logits: tuple = ()
    aux_losses: dict = dataclasses.field(default_factory=dict)
    token_stats: dict = dataclasses.field(default_factory=dict)
    stats: dict = dataclasses.field(default_factory=dict)


@runtime_checkable
class ApplyFn(Protocol):
    def __call__(
        self,
        params: dict,
        batch: dict,
        *,
        training: bool,
        rng: jax.Array,
        model_state: Any,
        sample: Hashable | None = None,
    ) -> Outputs: ...


@runtime_checkable
class GenerateFn(Protocol):
    def __call__(
        self,
        params: dict,
        model_state: Any,
        prompt_tokens: Int[Array, "B P"],
        prompt_mask: Int[Array, "B P"],
        prompt_control_flow: Int[Array, "B P"] | None,
        max_new_tokens: int,
        eos_id: int | None,
        pad_id: int,
        sampling: Sampling = GREEDY,
        key: jax.Array | None = None,
    ) -> GenerateOutput: ...


@dataclasses.dataclass(frozen=True)
class CachedGenerate:
    """`generate` of an architecture that decodes with a KV cache: decoding(params, model_state) gives its
    `Decoder` and what the decoder reads; the one loop `generate_with` does the rest. The decoder stays
    reachable (`decoding`): its prefill and decode step compile on their own (tools/aot_compile)."""

    decoding: Callable[[dict, Any], tuple[Decoder, Any]]

    def __call__(
        self,
        params,
        model_state,
        prompt,
        mask,
        control_flow,
        max_new_tokens,
        eos_id,
        pad_id,
        sampling=GREEDY,
        key=None,
    ):
        decoder, inputs = self.decoding(params, model_state)
        return generate_with(
            decoder,
            inputs,
            prompt,
            mask,
            max_new_tokens=max_new_tokens,
            key=key,
            **sampling._asdict(),
            eos_id=eos_id,
            pad_id=pad_id,
            prompt_control_flow=control_flow,
        )


def layout_of(batch: dict) -> Layout:
    return Layout(batch["positions"], batch["segment_ids"], batch["control_flow"])


def row_stats(logits: Float[Array, "B T V"], batch: dict) -> dict:
    """Per-row sums over supervised positions: next-token loss, token count, correct top-1 predictions,
    and, when the batch carries `target_bytes`, the targets' UTF-8 bytes ("bytes") and the loss of the
    targets that have bytes ("byte_loss_sum": nanochat's bits-per-byte numerator, eval.bpb_masking)."""
    mask = batch["loss_mask"].astype(jnp.float32)
    logits = logits.astype(jnp.float32)
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])
    # the target at the top (ties count): the max logsumexp takes anyway, rather than an argmax, a second
    # (index-tracking) pass over the vocabulary
    target_logit = jnp.take_along_axis(logits, batch["targets"][..., None], axis=-1)[..., 0]
    correct = (target_logit >= jnp.max(logits, axis=-1)).astype(jnp.float32)
    stats = {"loss_sum": (nll * mask).sum(-1), "tokens": mask.sum(-1), "correct": (correct * mask).sum(-1)}
    if "target_bytes" in batch:
        target_bytes = batch["target_bytes"].astype(jnp.float32) * mask
        stats["bytes"] = target_bytes.sum(-1)
        stats["byte_loss_sum"] = jnp.where(target_bytes > 0, nll, 0.0).sum(-1)
    return stats


def next_token_loss(outputs: Outputs, batch: dict) -> dict:
    """{metric: (sum, count)} over the batch: "loss" (masked next-token cross-entropy, plus each aux loss,
    per supervised token; its sum is what the gradient is taken of), "accuracy", "bpb" (bits per UTF-8
    byte of the targets: cross-entropy in bits over their bytes, without aux losses) when the batch carries
    `target_bytes`, each aux loss, and each token statistic over recurrent positions."""
    rows = jax.tree.map(jnp.sum, row_stats(outputs.logits, batch))
    tokens, loss = rows["tokens"], rows["loss_sum"]
    sums = {"accuracy": (rows["correct"], tokens)}
    if "bytes" in rows:
        sums["bpb"] = (rows["loss_sum"] / jnp.log(2.0), rows["bytes"])
    for name, value in outputs.aux_losses.items():
        sums[f"aux/{name}"] = (tokens * value, tokens)
        loss = loss + tokens * value
    recurrent = (batch["control_flow"] >= RECURRENT).astype(jnp.float32)
    for name, value in outputs.token_stats.items():
        sums[name] = ((value.astype(jnp.float32) * recurrent).sum(), recurrent.sum())
    return {"loss": (loss, tokens), **sums}


def _no_stats(params: dict) -> dict:
    return {}


def _empty_state() -> dict:
    return {}


@dataclasses.dataclass(frozen=True)
class Architecture:
    name: str
    specs: dict  # the parameter table: a ParamSpec per parameter, shaped like the params
    param_dtype: str
    apply: ApplyFn
    generate: GenerateFn
    loss: Callable[[Outputs, dict], dict] = next_token_loss
    # scalars of the params to log, on logging steps (T²MLR: tanh of γ)
    param_stats: Callable[[dict], dict] = _no_stats
    init_model_state: Callable[[], Any] = _empty_state  # non-gradient state at step 0
    # (model_state, stats summed over micro-batches) -> (model_state, scalar metrics to log)
    update_model_state: Callable[[Any, dict], tuple[Any, dict]] | None = None
    # (seed, step) -> the step's static choice, a NamedTuple whose fields the trainer logs
    sample: Callable[[int, int], Hashable] | None = None
    backbone: ModelConfig | None = None  # the transformer inside, when there is one (init_from, context)
    max_seq_len: int | None = None  # the longest row it accepts (None: any)
    # seq_len -> expected training FLOPs (forward + backward) of one row (t2mlr_jax.model.flops); None:
    # no accounting, so no train.flop_budget
    train_flops: Callable[[int], float] | None = None

    def init(self, key: jax.Array) -> dict:
        """Fresh params, drawn stacked whatever the table's layer form, so model.scan_layers changes none."""
        params = init_from_specs(layer_layout.stacked(self.specs), key, self.param_dtype)
        return layer_layout.per_layer(params) if layer_layout.is_per_layer(self.specs) else params

    def num_params(self) -> int:
        return count_specs(self.specs)


def with_layers_apart(arch: Architecture) -> Architecture:
    """`arch` with its blocks' weights held per layer (model.scan_layers=False): its table, and so its fresh
    draws, take that form, so the optimizer, shardings and checkpoints follow unchanged."""
    if arch.backbone is None:
        raise ValueError(f"model.scan_layers=False: architecture {arch.name!r} has no transformer blocks")
    return dataclasses.replace(arch, specs=layer_layout.per_layer(arch.specs))


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What an architecture can do beyond the contract, declared where it registers, so that the trainer,
    interop and generation read one record instead of naming architectures.

    export         its export mapping: its trained params -> a transformer backbone's (with or without
                   T²MLR's mixer) computing the same logits, so that interop reads its checkpoints as a
                   model and writes them in every PyTorch layout (`as_backbone` where they already are
                   one); None: its runs are not read as a model
    thought_slots  it decodes K latent thought slots per token, so eval.thoughts applies (its builder
                   still checks the count against what was trained)
    """

    export: Callable[[dict], dict] | None = None
    thought_slots: bool = False


def as_backbone(params: dict) -> dict:
    """The export mapping of an architecture whose params are exactly the backbone's."""
    return params


@dataclasses.dataclass(frozen=True)
class ArchitectureEntry:
    """A registered architecture: its builder and the name of its own config section (`section`, shared by
    aliases such as middle_looped, which reads `looped`). `identity`: which of the section's fields shape
    the saved state, so that a workdir trained with other values is refused: True (all), False (none: how
    T²MLR is trained or decoded may change on resume) or a tuple of field names. `capabilities`: what else
    it can do."""

    build: Callable[[Experiment], Architecture]
    section: str | None = None
    identity: bool | tuple[str, ...] = True
    capabilities: Capabilities = Capabilities()


ARCHITECTURES: Registry = Registry("architecture")


def register_architecture(
    name: str,
    build: Callable,
    *,
    settings: type | None = None,
    section: str | None = None,
    identity: bool | tuple[str, ...] = True,
    capabilities: Capabilities = Capabilities(),
) -> None:
    """Register `build(experiment) -> Architecture` under `name`. `settings`, a frozen dataclass, becomes
    its config section (`section`, default `name`: experiment.<section> in the builder); an alias names
    the section of one registered before it instead. `capabilities`: what else it can do."""
    if settings is not None:
        section = section or name
        register_section(section, settings)
    elif section is not None:
        SECTIONS.get(section)  # an alias of a section nobody registered: one error now
    ARCHITECTURES.register(name, ArchitectureEntry(build, section, identity, capabilities))


RANDOM_INIT = "random"  # config.init_from: random weights, on purpose (see require_init_from)


def pretrained_path(config: Experiment) -> str:
    """The checkpoint config.init_from names, "" when the weights start random (unset, "" or "random")."""
    return "" if config.init_from in (None, RANDOM_INIT) else config.init_from


def mlp_state_hooks(model: ModelConfig) -> dict:
    """The `Architecture` keyword arguments `init_model_state` / `update_model_state` that carry the
    backbone MLP's non-gradient state (MoE routing biases) as the LRT does: model_state["mlp"] is the
    state stacked on the backbone's layers, and after each step the MLP's `update_state` moves it from
    `Outputs.stats["mlp"]` (per-layer stats shaped [L, ...] like the state). One place, so that every
    architecture running the backbone keeps and updates it alike; a stateless MLP gets no state, no update."""
    mlp = MLPS[model.mlp]
    if mlp.init_state is None:
        return dict(init_model_state=_empty_state, update_model_state=None)

    def update_model_state(model_state, stats):
        state, metrics = mlp.update_state(model, model_state["mlp"], stats["mlp"])
        return {**model_state, "mlp": state}, metrics

    return dict(
        init_model_state=lambda: {"mlp": mlp.init_state(model)},
        update_model_state=None if mlp.update_state is None else update_model_state,
    )


def stack_layer_stats(*ranges: dict) -> dict:
    """The MLP's per-layer stats of consecutive block ranges (each stacked on its range's layers, {} when
    the range is empty or the MLP reports none) as one stack over all their layers: `run_blocks` reports
    each range apart, while `update_state` reads stats shaped like the state [L, ...]."""
    ranges = [stats for stats in ranges if stats]
    return jax.tree.map(lambda *a: jnp.concatenate(a), *ranges) if ranges else {}


def arch_names(config: Experiment) -> list[str]:
    """config.arch as a list: one name, or a comma list to train each and compare them."""
    names = [n.strip() for n in config.arch.split(",") if n.strip()]
    for name in names:
        ARCHITECTURES.get(name)
    if not names or len(set(names)) != len(names):
        raise ValueError(f"arch must name each architecture once, got {config.arch!r}")
    return names


def build_architecture(config: Experiment, name: str | None = None) -> Architecture:
    """The architecture `name` (default: config.arch, a single name) with freshly drawn weights."""
    name = name or config.arch
    entry = ARCHITECTURES.get(name)
    if config.eval.thoughts not in (None, 0) and not entry.capabilities.thought_slots:
        thinkers = sorted(n for n, e in ARCHITECTURES.items() if e.capabilities.thought_slots)
        raise ValueError(
            f"eval.thoughts={config.eval.thoughts}: architecture {name!r} has no latent thought slots "
            f"(those with them: {', '.join(thinkers)})"
        )
    arch = entry.build(config)
    return arch if config.model.scan_layers else with_layers_apart(arch)


def flops_per_step(config: Experiment, arch: Architecture) -> float | None:
    """The expected training FLOPs of one optimizer step (None: the architecture has no accounting)."""
    if arch.train_flops is None:
        return None
    return config.train.batch_size * arch.train_flops(config.data.seq_len)
