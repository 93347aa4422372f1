"""The parameter table: one place that names every parameter, its shape, logical axes and initializer.

`init_params` and `param_axes` are both read off this table, so names (which follow HF Llama:
q_proj, input_layernorm, ...), shapes and sharding axes cannot drift apart. Per-block parameters are
stacked on a leading `layers` axis so the blocks run under one `lax.scan`.
Weights are stored [in, out] (JAX convention); interop transposes to PyTorch's [out, in].
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from t2mlr_jax.model import layer_layout, moe  # noqa: F401  (moe registers mlp="moe")
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.layers import MLPS, layer_matrix, weight_init
from t2mlr_jax.model.spec import ParamSpec, constant, init_from_specs, ones, spec_axes, zeros
from t2mlr_jax.parallel.reuse import gather_once


def backbone_specs(cfg: ModelConfig) -> dict:
    """The backbone's table. Which entries exist follows the config: norm scales only with
    norm_weights, q_norm / k_norm only with qk_norm, pre_ / post_feedforward_layernorm only with
    sandwich_norms, the MLP's from its registry entry (`MLPS`)."""
    d, n_layers, e = cfg.hidden_size, cfg.num_layers, cfg.head_dim
    h, k, v = cfg.num_heads, cfg.num_kv_heads, cfg.vocab_size

    def norm(shape, axes):  # offsets from 1 (norm_offset) start at 0: every norm starts as the identity
        init = zeros if cfg.norm_offset else ones
        return ParamSpec(shape, axes, init, "norm") if cfg.norm_weights else None

    attn = {
        "q_proj": layer_matrix(cfg, (d, h, e), ("embed", "heads", "head_dim")),
        "k_proj": layer_matrix(cfg, (d, k, e), ("embed", "kv_heads", "head_dim")),
        "v_proj": layer_matrix(cfg, (d, k, e), ("embed", "kv_heads", "head_dim")),
        "o_proj": layer_matrix(cfg, (h, e, d), ("heads", "head_dim", "embed"), in_dims=2, role="out"),
    }
    if cfg.qk_norm != "none":  # one scale over head_dim shared by the heads (HF Qwen3's q_norm / k_norm)
        attn["q_norm"] = norm((n_layers, e), ("layers", "head_dim"))
        attn["k_norm"] = norm((n_layers, e), ("layers", "head_dim"))
    if cfg.value_embeds:  # every layer has a gate; those without a value embedding leave it unused
        attn["ve_gate"] = layer_matrix(cfg, (cfg.gate_channels, k), ("embed", "kv_heads"), role="token_gate")
    specs = {
        "embed_tokens": ParamSpec((v, d), ("vocab", "embed"), weight_init(cfg, "embedding"), "embedding"),
        "layers": {
            "input_layernorm": norm((n_layers, d), ("layers", "norm")),
            "self_attn": attn,
            "post_attention_layernorm": norm((n_layers, d), ("layers", "norm")),
            "mlp": MLPS[cfg.mlp].specs(cfg),
        },
        "norm": norm((d,), ("norm",)),
    }
    if cfg.sandwich_norms:
        specs["layers"]["pre_feedforward_layernorm"] = norm((n_layers, d), ("layers", "norm"))
        specs["layers"]["post_feedforward_layernorm"] = norm((n_layers, d), ("layers", "norm"))
    if cfg.embed_norm:
        specs["embed_norm"] = norm((d,), ("norm",))
    if not cfg.tie_embeddings:
        specs["lm_head"] = ParamSpec((d, v), ("embed", "vocab"), weight_init(cfg, "head"), "head", 1)
    if cfg.resid_scalars:
        resid, x0 = _resid_inits(cfg)
        specs["resid_lambdas"] = ParamSpec((n_layers,), ("layers",), resid, "residual")
        specs["x0_lambdas"] = ParamSpec((n_layers,), ("layers",), x0, "skip")
    # karpathy/nanochat's smear and backout scalars share one no-decay group (kind "gate") as in nanochat
    if cfg.smear_channels is not None:  # λ_smear starts at 0: the smear starts closed
        gate = weight_init(cfg, "token_gate")
        specs["smear_gate"] = ParamSpec(
            (cfg.smear_channels, 1), (None, None), gate, "gate", 1
        )  # tiny: replicated
        specs["smear_lambda"] = ParamSpec((1,), (None,), zeros, "gate")
    if cfg.backout:
        specs["backout_lambda"] = ParamSpec((1,), (None,), constant(0.2), "gate")
    if cfg.value_embeds:  # initialised like v_proj (nanochat)
        specs["value_embeds"] = ParamSpec(
            (len(cfg.value_embed_layers), v, k, e),
            (None, "vocab", "kv_heads", "value_embed"),
            weight_init(cfg, "in"),
            "embedding",
        )
    return _drop_none(specs)


def _resid_inits(cfg: ModelConfig):
    """λ_resid's and λ_x0's initializers: 1 and 0.1, or karpathy/nanochat's lines over the layers."""
    if cfg.init_scheme != "nanochat_karpathy":
        return constant(1.0), constant(0.1)
    depth = jnp.arange(cfg.num_layers, dtype=jnp.float32) / max(cfg.num_layers - 1, 1)
    line = lambda start, drop: lambda key, shape, dtype: (start - drop * depth).astype(dtype)
    return line(1.15, 0.10), line(0.20, 0.15)


def _drop_none(tree: dict) -> dict:
    return {k: _drop_none(v) if isinstance(v, dict) else v for k, v in tree.items() if v is not None}


def param_specs(cfg: ModelConfig) -> dict:
    specs = backbone_specs(cfg)
    if cfg.recurrence is not None:  # the parameters a recurrence adds (T²MLR's fusion)
        specs["mixer"] = cfg.recurrence.param_specs(cfg)
    return specs


def init_params(cfg: ModelConfig, key: jax.Array) -> dict:
    """Fresh parameters; pure, so `jax.jit(..., out_shardings=...)` initialises them sharded."""
    return init_from_specs(param_specs(cfg), key, cfg.param_dtype)


def param_axes(cfg: ModelConfig) -> dict:
    """The logical axis names of every parameter, as a pytree shaped like the params."""
    return spec_axes(param_specs(cfg))


def gathered(cfg: ModelConfig, params: dict, specs: dict, names: Sequence[str]) -> dict:
    """`params` with its entries `names` (what a loop of passes rereads) gathered once (`gather_once`),
    in the compute dtype as the blocks read them: the blocks' weights cast whole, others' matrices (were
    a matrix gathered in fp32 and cast inside the loop, XLA would gather the cast copy at every pass).
    `specs`: the table params follow (`layers` stacked; held per layer here when params' are)."""
    if isinstance(params["layers"], tuple):
        specs = layer_layout.map_layers(specs, layer_layout.split)
    axes = spec_axes(specs)

    def cast(name: str, x: jax.Array) -> jax.Array:
        matrix = name == "layers" or x.ndim >= 2
        return x.astype(cfg.dtype) if matrix and jnp.issubdtype(x.dtype, jnp.floating) else x

    reused = {name: jax.tree.map(functools.partial(cast, name), params[name]) for name in names}
    return {**params, **gather_once(reused, {name: axes[name] for name in names})}
