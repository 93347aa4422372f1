"""Looped transformers: blocks [start, end] run `repeats` times in depth (weights shared across repeats).

Full looping x2 is start=0, end=-1; the paper's middle-looped x3 over layers 9-22 is start=8, end=21.
Training loops over the shared weights (`looped_forward`); decoding uses the same model written out as a
plain transformer with the looped blocks repeated (`unrolled`), so it gets the backbone's KV cache.
Registered as `looped` and `middle_looped` (the same module; presets choose the range), both reading the
config section `looped`.
"""

from __future__ import annotations

import jax
import ml_collections
import numpy as np
from jaxtyping import Array, Float, Int

from t2mlr_jax.architectures.contract import (
    Architecture,
    Outputs,
    cached_generate,
    layout_of,
    register_architecture,
)
from t2mlr_jax.architectures.t2mlr import baseline_backbone
from t2mlr_jax.model import generate as generation
from t2mlr_jax.model.backbone import embed, head, run_blocks
from t2mlr_jax.model.config import ModelConfig, resolve_range
from t2mlr_jax.model.params import param_specs
from t2mlr_jax.model.recurrence import Layout


def loop_range(cfg: ModelConfig, start: int, end: int) -> tuple[int, int]:
    """0-based inclusive [start, end] with negative `end` counted from the last block."""
    start, end = resolve_range(start, end, cfg.num_layers)
    if not 0 <= start <= end < cfg.num_layers:
        raise ValueError(f"loop range [{start}, {end}] is not inside {cfg.num_layers} layers")
    return start, end


def looped_forward(
    cfg: ModelConfig,
    params: dict,
    tokens: Int[Array, "B T"],
    layout: Layout,
    *,
    start: int,
    end: int,
    repeats: int,
) -> Float[Array, "B T V"]:
    start, end = loop_range(cfg, start, end)
    kw = dict(positions=layout.positions, segment_ids=layout.segment_ids, tokens=tokens)
    h = run_blocks(cfg, params, embed(cfg, params, tokens), 0, start, **kw).h
    h = jax.lax.fori_loop(0, repeats, lambda _, h: run_blocks(cfg, params, h, start, end + 1, **kw).h, h)
    h = run_blocks(cfg, params, h, end + 1, cfg.num_layers, **kw).h
    return head(cfg, params, h)


def unrolled(
    cfg: ModelConfig, params: dict, *, start: int, end: int, repeats: int
) -> tuple[ModelConfig, dict]:
    """The looped model as a plain transformer: blocks 0..start-1, then [start, end] `repeats` times, then
    the rest (the repeated blocks' weights copied): the same function, `start + repeats (end - start + 1) +
    (L - end - 1)` layers deep."""
    start, end = loop_range(cfg, start, end)
    order = np.r_[
        np.arange(start), np.tile(np.arange(start, end + 1), repeats), np.arange(end + 1, cfg.num_layers)
    ]
    return (
        cfg.replace(num_layers=len(order)),
        {**params, "layers": jax.tree.map(lambda p: p[order], params["layers"])},
    )


def _builder(name: str):
    def build(config: ml_collections.ConfigDict) -> Architecture:
        loop = dict(start=config.looped.start, end=config.looped.end, repeats=config.looped.repeats)
        model = baseline_backbone(config, param_specs)
        loop_range(model, loop["start"], loop["end"])  # reject a bad range before anything is traced

        def apply(params, batch, *, training, rng, model_state, sample=None):
            return Outputs(looped_forward(model, params, batch["tokens"], layout_of(batch), **loop))

        def decoding(params, model_state):
            cfg, weights = unrolled(model, params, **loop)
            return generation.T2MLRDecoder(cfg), weights

        return Architecture(
            name,
            param_specs(model),
            model.param_dtype,
            apply,
            cached_generate(decoding),
            backbone=model,
            max_seq_len=model.max_seq_len,
        )

    return build


register_architecture(
    "looped", _builder("looped"), section="looped", defaults=dict(start=0, end=-1, repeats=2)
)
register_architecture("middle_looped", _builder("middle_looped"), section="looped")
