"""Looped transformers: blocks [start, end] run `repeats` times in depth (weights shared across repeats).

Full looping x2 is start=0, end=-1; the paper's middle-looped x3 over layers 9-22 is start=8, end=21.
Training loops over the shared weights (`looped_forward`); decoding (`LoopedDecoder`) runs the same block
ranges on the shared weights with one KV-cache layer per executed block (`block_order`).
Registered as `looped` and `middle_looped` (the same module; presets choose the range), both reading the
config section `looped`.

A stateful MLP (mlp="moe") keeps one state slice per weight layer (model_state["mlp"], [L, ...]): every
repeat of a looped block reads its slice, and the step's stats sum the repeats' loads into that slot.
Evaluation and decoding never drop tokens (moe_capacity_factor=None), as in the LRT.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from t2mlr_jax.architectures.contract import (
    Architecture,
    CachedGenerate,
    Outputs,
    layout_of,
    mlp_state_hooks,
    register_architecture,
    stack_layer_stats,
)
from t2mlr_jax.architectures.t2mlr import baseline_backbone
from t2mlr_jax.config.sections import Experiment, at_least
from t2mlr_jax.model import flops
from t2mlr_jax.model.backbone import KVCache, advance, embed, head, init_cache, run_blocks, split_layers
from t2mlr_jax.model.config import ModelConfig, resolve_range
from t2mlr_jax.model.params import gathered, param_specs
from t2mlr_jax.model.token_layout import Layout, Output


def loop_range(cfg: ModelConfig, start: int, end: int) -> tuple[int, int]:
    """0-based inclusive [start, end] with negative `end` counted from the last block."""
    start, end = resolve_range(start, end, cfg.num_layers)
    if not 0 <= start <= end < cfg.num_layers:
        raise ValueError(f"loop range [{start}, {end}] is not inside {cfg.num_layers} layers")
    return start, end


class LoopedOut(NamedTuple):
    logits: Float[Array, "B T V"]
    stats: dict  # the MLP's per-layer stats [L, ...]; the looped blocks' summed over the repeats


def looped_forward(
    cfg: ModelConfig,
    params: dict,
    tokens: Int[Array, "B T"],
    layout: Layout,
    *,
    start: int,
    end: int,
    repeats: int,
    mlp_state: Any = None,
    embed_scale: float = 1.0,
) -> LoopedOut:
    """The looped model's logits and the MLP's per-layer stats (its state is stacked on the L weight
    layers)."""
    start, end = loop_range(cfg, start, end)
    kw = dict(positions=layout.positions, segment_ids=layout.segment_ids, tokens=tokens, mlp_state=mlp_state)
    before = run_blocks(cfg, params, scaled_embed(cfg, params, tokens, embed_scale), 0, start, **kw)

    looped = gathered(cfg, split_layers(cfg, params, (start, end + 1))[1], param_specs(cfg), ("layers",))

    def repeat(h, _):  # each repeat rereads the looped blocks: gathered once, above
        out = run_blocks(cfg, looped, h, start, end + 1, **kw)
        return out.h, out.stats

    h, loop_stats = jax.lax.scan(repeat, before.h, None, length=repeats)
    after = run_blocks(cfg, params, h, end + 1, cfg.num_layers, **kw)
    loop_stats = jax.tree.map(lambda a: a.sum(0), loop_stats)
    return LoopedOut(head(cfg, params, after.h), stack_layer_stats(before.stats, loop_stats, after.stats))


def scaled_embed(
    cfg: ModelConfig, params: dict, tokens: Int[Array, "B T"], scale: float, cache: KVCache | None = None
) -> Float[Array, "B T D"]:
    """The token embeddings x `scale` (`looped.embed_scale`); `cache` as backbone.embed's (the smear)."""
    x = embed(cfg, params, tokens, cache)
    return x if scale == 1.0 else (x * scale).astype(x.dtype)


def block_order(cfg: ModelConfig, *, start: int, end: int, repeats: int) -> list[int]:
    """The weight layer of each executed block: 0..start-1, then [start, end] `repeats` times, the rest."""
    start, end = loop_range(cfg, start, end)
    loop = list(range(start, end + 1))
    return [*range(start), *loop * repeats, *range(end + 1, cfg.num_layers)]


@dataclasses.dataclass(frozen=True)
class LoopedDecoder:
    """The looped model for `generate_with` with the KV cache: one cache layer per executed block
    (`block_order`), each range of blocks run on the shared weights and the MLP's state (its params are
    (params, mlp_state)), so every per-layer choice (windows, value embeddings, resid scalars, routing
    biases) is the weight layer's. The prompt fills the cache in one parallel pass; no state vector."""

    model: ModelConfig
    start: int
    end: int
    repeats: int
    embed_scale: float = 1.0

    def init_cache(self, batch, num_tokens):
        order = block_order(self.model, start=self.start, end=self.end, repeats=self.repeats)
        return init_cache(self.model.replace(num_layers=len(order)), batch, num_tokens)

    def prefill(self, params, tokens, layout, cache):
        state = jnp.zeros((tokens.shape[0], self.model.hidden_size), self.model.dtype)
        return self.step(params, tokens, state, cache, layout)

    def step(self, params, tokens, state, cache, layout):
        params, mlp_state = params
        cfg = self.model
        start, end = loop_range(cfg, self.start, self.end)
        ranges = [(0, start), *[(start, end + 1)] * self.repeats, (end + 1, cfg.num_layers)]
        h, row = scaled_embed(cfg, params, tokens, self.embed_scale, cache), 0
        for first, last in ranges:
            out = run_blocks(cfg, params, h, first, last, positions=layout.positions,
                             segment_ids=layout.segment_ids, cache=cache, tokens=tokens,
                             mlp_state=mlp_state, cache_row=row)  # fmt: skip
            h, cache, row = out.h, out.cache, row + last - first
        return Output(head(cfg, params, h), state, {}, advance(cache, tokens.shape[1]))


def _builder(name: str):
    def build(config: Experiment) -> Architecture:
        loop = dict(start=config.looped.start, end=config.looped.end, repeats=config.looped.repeats)
        model = baseline_backbone(config, param_specs, carries_mlp_state=True)
        loop["embed_scale"] = math.sqrt(2.5 * model.hidden_size) if config.looped.embed_scale else 1.0
        loop_range(model, loop["start"], loop["end"])  # reject a bad range before anything is traced
        # Evaluation and decoding never drop a token (MoE): outputs must not depend on the batch's routing.
        eval_model = model.replace(moe_capacity_factor=None)

        def apply(params, batch, *, training, rng, model_state, sample=None):
            out = looped_forward(
                model if training else eval_model,
                params,
                batch["tokens"],
                layout_of(batch),
                mlp_state=model_state.get("mlp"),
                **loop,
            )
            return Outputs(out.logits, stats={"mlp": out.stats})

        def decoding(params, model_state):
            return LoopedDecoder(eval_model, **loop), (params, model_state.get("mlp"))

        return Architecture(
            name,
            param_specs(model),
            model.param_dtype,
            apply,
            CachedGenerate(decoding),
            backbone=model,
            max_seq_len=model.max_seq_len,
            train_flops=lambda seq_len: flops.one_pass_train_flops(
                model,
                seq_len,
                layers=block_order(model, start=loop["start"], end=loop["end"], repeats=loop["repeats"]),
            ),
            **mlp_state_hooks(model),
        )

    return build


@dataclasses.dataclass(frozen=True)
class LoopedSettings:
    """Blocks [start, end] (0-based, negative from the end) run `repeats` times (config section `looped`)."""

    start: int = 0
    end: int = -1
    repeats: int = 2
    embed_scale: bool = False  # token embeddings x sqrt(2.5 H): PonderLM-2's release's loop baseline

    def __post_init__(self):
        at_least("looped.repeats", self.repeats, 1)


register_architecture("looped", _builder("looped"), settings=LoopedSettings)
register_architecture("middle_looped", _builder("middle_looped"), section="looped")
