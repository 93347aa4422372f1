"""T²MLR and the plain transformer: the backbone with or without the temporal recurrence.

t2mlr        Jacobi (release) or exact training, exact evaluation by default; its settings are
             config.model.recurrence (the model) and config.t2mlr (how it is trained, evaluated, decoded)
transformer  the same backbone without the recurrence, widened to T²MLR's parameter count when
             baseline.param_match is on (the paper's parameter-matched baseline)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import jax.numpy as jnp

from t2mlr_jax.architectures.contract import (
    Architecture,
    CachedGenerate,
    Capabilities,
    Outputs,
    as_backbone,
    layout_of,
    pretrained_path,
    register_architecture,
)
from t2mlr_jax.architectures.depth_sampling import depth_values, draw_at
from t2mlr_jax.architectures.t2mlr import flops, t2mlr_torch  # noqa: F401  (t2mlr_torch: its checkpoint format)
from t2mlr_jax.architectures.t2mlr.decode import PREFILLS, T2MLRDecoder
from t2mlr_jax.architectures.t2mlr.fusion import gamma_stats
from t2mlr_jax.architectures.t2mlr.recurrence import forward
from t2mlr_jax.architectures.t2mlr.settings import RecurrenceConfig
from t2mlr_jax.config.sections import Experiment, one_of, register_section
from t2mlr_jax.model import flops as backbone_flops
from t2mlr_jax.model.config import ModelConfig, check_depths
from t2mlr_jax.model.layers import MLPS
from t2mlr_jax.model.params import param_specs
from t2mlr_jax.model.spec import count_specs, matched_width

FORWARD_MODES = ("jacobi", "exact")


class Depth(NamedTuple):
    """A training step's static choice when t2mlr.d_forward_values samples it: the Jacobi depth D."""

    d_forward: int


@dataclasses.dataclass(frozen=True)
class T2MLRSettings:
    """How T²MLR is trained, evaluated and decoded (config section `t2mlr`)."""

    forward_mode: str = "jacobi"  # training: jacobi (the release) | exact (token by token)
    bptt: int = 0  # exact training: truncation B of backpropagation through time; 0 = full
    d_forward_values: str = ""  # sample D per step: "N" (d_forward_min..N) or "8,16,32"; "" = model's D
    d_forward_min: int = 1
    eval_mode: str = "exact"  # teacher-forced evaluation: exact recurrence (the release) | jacobi
    prefill: str = "exact"  # generation prefill: exact | jacobi (prefill_passes passes, the paper's Table 8)
    prefill_passes: int = 8

    def __post_init__(self):
        one_of("t2mlr.forward_mode", self.forward_mode, FORWARD_MODES)
        one_of("t2mlr.eval_mode", self.eval_mode, FORWARD_MODES)
        one_of("t2mlr.prefill", self.prefill, PREFILLS)
        check_depths(self.prefill_passes, 0)  # Jacobi prefill passes


def stateless(model: ModelConfig) -> ModelConfig:
    """The backbone of an architecture that keeps no non-gradient state (all but the LRT and the looped
    transformers so far)."""
    if MLPS[model.mlp].init_state is not None:
        raise ValueError(
            f"mlp {model.mlp!r} keeps routing state that this architecture does not carry; train it with "
            "arch=lrt (lrt.feedback=none is the plain backbone) or arch=looped / middle_looped"
        )
    return model


def backbone_architecture(name: str, model: ModelConfig, settings: T2MLRSettings | None) -> Architecture:
    """The backbone as an architecture; `settings` (config.t2mlr) says how a recurrent one runs."""
    stateless(model)
    s = settings or T2MLRSettings()
    decoder = T2MLRDecoder(model, s.prefill, s.prefill_passes)
    adaptive = model.recurrence is not None and bool(model.recurrence.jacobi_tolerance)

    def apply(params, batch, *, training, rng, model_state, sample=None):
        # Without recurrence every mode is the same function; "jacobi" computes it in one parallel pass.
        mode = "jacobi" if model.recurrence is None else s.forward_mode if training else s.eval_mode
        bptt = (s.bptt or None) if training else None
        d_forward = None if sample is None else sample.d_forward  # None: the model's D
        out = forward(
            model, params, batch["tokens"], mode=mode, layout=layout_of(batch), bptt=bptt, d_forward=d_forward
        )
        token_stats = {f"gate/{k}": v for k, v in out.gate_stats.items()}
        if adaptive and out.jacobi_passes is not None:
            # The passes convergence-adaptive Jacobi used, logged as `jacobi_passes`: as a per-token stat,
            # since `stats` would be summed over micro-batches, token stats are averaged.
            token_stats["jacobi_passes"] = jnp.broadcast_to(out.jacobi_passes, batch["tokens"].shape)
            if out.jacobi_change is not None:  # convergence: 0 where the passes stopped at their cap
                converged = out.jacobi_change < model.recurrence.jacobi_tolerance
                for key, value in (("jacobi_change", out.jacobi_change), ("jacobi_converged", converged)):
                    token_stats[key] = jnp.broadcast_to(value.astype(jnp.float32), batch["tokens"].shape)
        return Outputs(out.logits, token_stats=token_stats)

    arch = Architecture(
        name,
        param_specs(model),
        model.param_dtype,
        apply,
        CachedGenerate(lambda params, model_state: (decoder, params)),
        backbone=model,
        max_seq_len=model.max_seq_len,
        train_flops=train_flops(model, s),
    )
    if model.recurrence is None:
        return arch
    return dataclasses.replace(arch, param_stats=lambda params: gamma_stats(model, params["mixer"]))


def train_flops(
    model: ModelConfig, settings: T2MLRSettings, depths: list[int] | None = None
) -> Callable[[int], float]:
    """seq_len -> the expected training FLOPs of a row in the training mode `settings` names: Jacobi at the
    model's D, or averaged over the `depths` t2mlr.d_forward_values draws uniformly; exact with its bptt."""
    if model.recurrence is None:
        return lambda seq_len: backbone_flops.one_pass_train_flops(model, seq_len)
    if settings.forward_mode == "exact":
        return lambda seq_len: flops.exact_train_flops(model, seq_len, settings.bptt or None)
    depths = depths or [model.recurrence.d_forward]
    return lambda seq_len: sum(flops.jacobi_train_flops(model, seq_len, d) for d in depths) / len(depths)


def baseline_backbone(
    config: Experiment,
    specs_at: Callable[[ModelConfig], dict],
    *,
    carries_mlp_state: bool = False,
) -> ModelConfig:
    """The plain backbone a baseline runs on: config.model without the recurrence, widened (in steps of
    baseline.width_multiple) to the T²MLR model's parameter count when baseline.param_match is on.
    `specs_at(model)` is the baseline's parameter table at a given backbone. `carries_mlp_state`: the
    baseline keeps a stateful MLP's state (`contract.mlp_state_hooks`); otherwise such an MLP is refused."""
    plain = config.model.replace(recurrence=None)
    if not carries_mlp_state:
        stateless(plain)
    if not config.baseline.param_match:
        return plain
    if pretrained_path(config):
        raise ValueError(
            "baseline.param_match widens the baseline, so it cannot load init_from's weights; set "
            "--config.baseline.param_match=False to train the pretrained width"
        )
    target = count_specs(param_specs(config.model))
    width = matched_width(
        lambda h: count_specs(specs_at(plain.replace(hidden_size=h))),
        target,
        plain.hidden_size,
        config.baseline.width_multiple,
    )
    return plain.replace(hidden_size=width)


def _t2mlr(config: Experiment) -> Architecture:
    model = config.model
    arch = backbone_architecture("t2mlr", model, config.t2mlr)
    depths = depth_values(config)
    if depths is None:
        return arch
    return dataclasses.replace(
        arch,
        sample=lambda seed, step: Depth(draw_at(depths, seed, step)),
        train_flops=train_flops(model, config.t2mlr, depths),
    )


def _transformer(config: Experiment) -> Architecture:
    return backbone_architecture("transformer", baseline_backbone(config, param_specs), None)


register_section("model.recurrence", RecurrenceConfig)  # the recurrence a ModelConfig carries
register_architecture(
    "t2mlr", _t2mlr, settings=T2MLRSettings, identity=False, capabilities=Capabilities(export=as_backbone)
)
register_architecture("transformer", _transformer, capabilities=Capabilities(export=as_backbone))
