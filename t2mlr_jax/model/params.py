"""The parameter table: one place that names every parameter, its shape, logical axes and initializer.

`init_params` and `param_axes` are both read off this table, so names (which follow HF Llama:
q_proj, input_layernorm, ...), shapes and sharding axes cannot drift apart. Per-block parameters are
stacked on a leading `layers` axis so the blocks run under one `lax.scan`.
Weights are stored [in, out] (JAX convention); interop transposes to PyTorch's [out, in].
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from t2mlr_jax.model.config import ModelConfig

Init = Callable[[jax.Array, tuple, Any], jax.Array]


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    shape: tuple[int, ...]
    axes: tuple[str | None, ...]  # logical axis names, one per dimension; None = replicated
    init: Init
    dtype: str | None = None  # None = the model's param_dtype; "float32" pins (the gammas)


def normal(std: float) -> Init:
    return jax.nn.initializers.normal(stddev=std)


def ones(key, shape, dtype):
    return jnp.ones(shape, dtype)


def zeros(key, shape, dtype):
    return jnp.zeros(shape, dtype)


def backbone_specs(cfg: ModelConfig) -> dict:
    d, n_layers, e = cfg.hidden_size, cfg.num_layers, cfg.head_dim
    h, k, f, v = cfg.num_heads, cfg.num_kv_heads, cfg.mlp_dim, cfg.vocab_size
    w = normal(cfg.init_std)
    specs = {
        "embed_tokens": ParamSpec((v, d), ("vocab", "embed"), w),
        "layers": {
            "input_layernorm": ParamSpec((n_layers, d), ("layers", "norm"), ones),
            "self_attn": {
                "q_proj": ParamSpec((n_layers, d, h, e), ("layers", "embed", "heads", "head_dim"), w),
                "k_proj": ParamSpec((n_layers, d, k, e), ("layers", "embed", "kv_heads", "head_dim"), w),
                "v_proj": ParamSpec((n_layers, d, k, e), ("layers", "embed", "kv_heads", "head_dim"), w),
                "o_proj": ParamSpec((n_layers, h, e, d), ("layers", "heads", "head_dim", "embed"), w),
            },
            "post_attention_layernorm": ParamSpec((n_layers, d), ("layers", "norm"), ones),
            "mlp": {
                "gate_proj": ParamSpec((n_layers, d, f), ("layers", "embed", "mlp"), w),
                "up_proj": ParamSpec((n_layers, d, f), ("layers", "embed", "mlp"), w),
                "down_proj": ParamSpec((n_layers, f, d), ("layers", "mlp", "embed"), w),
            },
        },
        "norm": ParamSpec((d,), ("norm",), ones),
    }
    if not cfg.tie_embeddings:
        specs["lm_head"] = ParamSpec((d, v), ("embed", "vocab"), w)
    return specs


def param_specs(cfg: ModelConfig) -> dict:
    from t2mlr_jax.model.fusion import mixer_specs  # fusion builds on this module

    specs = backbone_specs(cfg)
    if cfg.recurrence is not None:
        specs["mixer"] = mixer_specs(cfg)
    return specs


def _is_spec(x) -> bool:
    return isinstance(x, ParamSpec)


def init_from_specs(specs: dict, key: jax.Array, param_dtype: str) -> dict:
    """Draw every parameter of a spec tree (the whole model, or a part such as the mixer)."""
    leaves, treedef = jax.tree.flatten(specs, is_leaf=_is_spec)
    keys = jax.random.split(key, max(len(leaves), 1))
    return jax.tree.unflatten(
        treedef, [s.init(k, s.shape, jnp.dtype(s.dtype or param_dtype)) for s, k in zip(leaves, keys)]
    )


def init_params(cfg: ModelConfig, key: jax.Array) -> dict:
    """Fresh parameters; pure, so `jax.jit(..., out_shardings=...)` initialises them sharded."""
    cfg.validate()
    return init_from_specs(param_specs(cfg), key, cfg.param_dtype)


def param_axes(cfg: ModelConfig) -> dict:
    """The logical axis names of every parameter, as a pytree shaped like the params."""
    return jax.tree.map(lambda s: s.axes, param_specs(cfg), is_leaf=_is_spec)


def count_params(params) -> int:
    return sum(int(x.size) for x in jax.tree.leaves(params))
