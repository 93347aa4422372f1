"""A research system kept outside the package, as a user's or a test's would be: one module that registers
its architecture and its config section when imported. `T2MLR_JAX_SYSTEMS=tests.toy_system` makes every
entry point (main.py, its --help, the tools) find it; tests/train/test_toy_architecture.py imports it.

The toy is a plain backbone whose embedding is scaled by a learned scalar; it counts the tokens it was
trained on in its model_state and penalises the scale with an aux loss. Its export mapping folds the
scale into the embedding, so that interop writes its runs in every PyTorch layout of a backbone."""

import dataclasses

import jax.numpy as jnp

from t2mlr_jax.architectures import Architecture, Capabilities, register_architecture
from t2mlr_jax.architectures.contract import Outputs, layout_of
from t2mlr_jax.architectures.t2mlr import generate as backbone_generate
from t2mlr_jax.model import backbone
from t2mlr_jax.model.params import param_specs
from t2mlr_jax.model.spec import ParamSpec


def fold_scale(params: dict) -> dict:
    """The toy's params as the plain backbone's computing the same logits: the scale folded into the
    embedding (tied or not, the head reads the same scaled matrix); its export mapping."""
    rest = {k: v for k, v in params.items() if k != "embed_scale"}
    return {**rest, "embed_tokens": params["embed_tokens"] * params["embed_scale"]}


def build(config) -> Architecture:
    model = config.model.replace(recurrence=None)
    init_scale = lambda key, shape, dtype: jnp.full(shape, config.toy.scale_init, dtype)
    specs = {**param_specs(model), "embed_scale": ParamSpec((1,), (None,), init_scale, "scalar")}

    def logits(params, tokens, layout):
        return backbone.forward(
            model, fold_scale(params), tokens, positions=layout.positions, segment_ids=layout.segment_ids
        )

    def apply(params, batch, *, training, rng, model_state, sample=None):
        return Outputs(
            logits(params, batch["tokens"], layout_of(batch)),
            aux_losses={"scale": 1e-3 * jnp.sum(params["embed_scale"] ** 2)},
            stats={"tokens_seen": batch["loss_mask"].sum()},
        )

    def generate(params, model_state, prompt, mask, control_flow, max_new_tokens, eos_id, pad_id):
        return backbone_generate(
            model,
            fold_scale(params),
            prompt,
            mask,
            max_new_tokens=max_new_tokens,
            eos_id=eos_id,
            pad_id=pad_id,
        )

    return Architecture(
        "toy", specs, model.param_dtype, apply, generate,
        init_model_state=lambda: {"tokens_seen": jnp.zeros((), jnp.float32)},
        update_model_state=lambda state, stats: (
            {"tokens_seen": state["tokens_seen"] + stats["tokens_seen"]},
            {},
        ),
        backbone=model, max_seq_len=model.max_seq_len,
    )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class ToySettings:
    """The toy's own config section `toy`, with its defaults and its check."""

    scale_init: float = 0.5

    def __post_init__(self):
        if self.scale_init <= 0:
            raise ValueError(f"toy.scale_init must be > 0, got {self.scale_init}")


register_architecture("toy", build, settings=ToySettings, capabilities=Capabilities(export=fold_scale))
