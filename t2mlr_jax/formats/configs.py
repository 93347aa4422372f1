"""Configuration conversion (pure Python, no JAX): HF Llama / Qwen3 config.json <-> `ModelConfig` (Gemma3
text: import only). The authors' T²MLR release config is architectures/t2mlr/release_configs.py's; our own
checkpoints store `ModelConfig` through t2mlr_jax.config.convert.

Every importer refuses settings it cannot reproduce exactly, listing all of them in one ValueError,
rather than loading a model that silently computes something else.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from t2mlr_jax.model.config import SHAPE_FIELDS, ModelConfig

# ---------------------------------------------------------------------------------------------
# HF config.json: the Llama family.


@dataclasses.dataclass(frozen=True)
class HFModel:
    """One HF model type our backbone reproduces exactly."""

    architecture: str
    block: dict  # the BLOCK_FIELDS it fixes; the others keep ModelConfig's defaults (which are Llama's)
    defaults: dict  # transformers' values for keys a config.json may omit, where the type differs from Llama
    export: dict | None  # keys only its config.json has, as we write them; None: import only
    activation: tuple[str, str] = ("hidden_act", "silu")  # its config key and the one value we implement


# The one table of supported HF model types. Qwen3 is Llama plus a weighted RMSNorm of q and k over
# head_dim before RoPE (eps rms_norm_eps, like ours) and optional sliding windows (`_windows`; import only).
HF_MODELS = {
    "llama": HFModel("LlamaForCausalLM", block={}, defaults={}, export={"mlp_bias": False}),
    "qwen3": HFModel(
        "Qwen3ForCausalLM",
        block={"qk_norm": "before_rope"},
        defaults={"head_dim": 128, "max_position_embeddings": 32768, "max_window_layers": 28},
        export={"use_sliding_window": False, "sliding_window": None},
    ),
    # Gemma3 text: (1 + w) RMSNorms everywhere, sqrt(hidden)-scaled embeddings, sandwich norms, GeGLU
    # (tanh GELU), QK-norm before RoPE, query_pre_attn_scalar, sliding layers with their own RoPE base
    # (`_gemma3_fields`). Import only.
    "gemma3_text": HFModel(
        "Gemma3ForCausalLM",
        block={
            "norm_offset": True,
            "embed_scale": True,
            "sandwich_norms": True,
            "qk_norm": "before_rope",
            "mlp": "geglu",
        },
        defaults={
            "head_dim": 256,
            "max_position_embeddings": 131072,
            "tie_word_embeddings": True,
            "hidden_activation": "gelu_pytorch_tanh",
            "query_pre_attn_scalar": 256,
            "sliding_window": 4096,
            "sliding_window_pattern": 6,
            "rope_theta": 1_000_000.0,
            "rope_local_base_freq": 10_000.0,
        },
        export=None,
        activation=("hidden_activation", "gelu_pytorch_tanh"),
    ),
}
# The backbone's configurable parts (norms, QK-norm, windows, softcaps, MLP): Llama is their defaults.
BLOCK_FIELDS = ("norm_weights", "embed_norm", "qk_norm", "window_pattern", "sliding_window",
                "last_layer_full", "attn_softcap", "logit_softcap", "mlp", "resid_scalars", "value_embeds",
                "ve_every_layer", "norm_offset", "embed_scale", "sandwich_norms", "query_pre_attn_scalar",
                "rope_local_theta", "rope_table_dtype")  # fmt: skip


def refuse(problems: list[str], what: str) -> None:
    """One ValueError listing every setting of `what` that cannot be converted exactly (if any)."""
    if problems:
        raise ValueError(f"{what}: cannot convert exactly:\n  - " + "\n  - ".join(problems))


def _supported(model_types) -> str:
    return ", ".join(map(repr, model_types))


def _kinds(layer_types) -> str:
    """HF layer_types as one S (sliding) or L (full) per layer."""
    return "".join("L" if kind == "full_attention" else "S" for kind in layer_types)


def _windows(kinds: str, window: int | None, problems: list[str]) -> dict:
    """Our window fields for per-layer kinds over HF's sliding_window. transformers' sliding_window_overlay
    keeps keys with kv > q - sliding_window, i.e. it counts the query (keys at most sliding_window - 1 slots
    back); ours counts the slots back. The pattern is the shortest period from layer 0 that reproduces
    every layer: below the last with the last full (our default), else over all (last_layer_full=False)."""
    if "S" not in kinds:
        return {}
    if window is None or int(window) < 2:
        problems.append(
            f"sliding-window layers {kinds!r} (S = sliding) with sliding_window={window} (only a window of "
            ">= 2 keys counting the query)"
        )
        return {}
    last_full = kinds[-1] == "L"
    tiled = len(kinds) - last_full
    period = next(p for p in range(1, len(kinds) + 1) if all(kinds[i] == kinds[i % p] for i in range(tiled)))
    fields = {"window_pattern": kinds[:period], "sliding_window": int(window) - 1}
    return fields if last_full else {**fields, "last_layer_full": False}


def model_config_from_hf(
    hf: dict, *, param_dtype: str = "float32", model_types: tuple[str, ...] = tuple(HF_MODELS)
) -> ModelConfig:
    """A `ModelConfig` from a config.json of one of `model_types` (transformers 4.x or 5.x spelling)."""
    model_type = hf.get("model_type")
    if model_type not in model_types:
        raise ValueError(
            f"HF config: model_type {model_type!r} is not supported (supported: {_supported(model_types)})"
        )
    model = HF_MODELS[model_type]
    hf = {**model.defaults, **hf}
    problems = []
    key, act = model.activation
    if hf.get(key, act) != act:
        problems.append(f"{key} {hf[key]!r} (only {act})")
    for flag in ("attention_bias", "mlp_bias"):
        if hf.get(flag):
            problems.append(f"{flag}=true (biases are not part of the parameter table)")
    fields = (_gemma3_fields if model_type == "gemma3_text" else _llama_fields)(hf, problems)
    refuse(problems, f"HF {model_type} config")
    heads = int(hf["num_attention_heads"])
    return ModelConfig(
        vocab_size=int(hf["vocab_size"]),
        hidden_size=int(hf["hidden_size"]),
        num_layers=int(hf["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=int(hf.get("head_dim") or hf["hidden_size"] // heads),
        mlp_dim=int(hf["intermediate_size"]),
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        init_std=float(hf.get("initializer_range", 0.02)),
        max_seq_len=int(hf.get("max_position_embeddings", 8192)),
        param_dtype=param_dtype,
        **model.block,
        **fields,
    )


def _rope_theta(rope: dict, scaling: dict, problems: list[str], where: str = "") -> float:
    """The base of a default rotary embedding (HF rope_parameters, or 4.x rope_theta / rope_scaling)."""
    rope_type = rope.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
    if rope_type != "default":
        problems.append(f"rope type {rope_type!r}{where} (only the default rotary embedding)")
    return float(rope.get("rope_theta", 10_000.0))


def _llama_fields(hf: dict, problems: list[str]) -> dict:
    """Llama / Qwen3: one RoPE base; Qwen3's sliding layers are `layer_types` when given, else Qwen3Config's
    rule (with use_sliding_window, every layer from max_window_layers up, over sliding_window keys)."""
    rope = {"rope_theta": hf.get("rope_theta", 10_000.0), **(hf.get("rope_parameters") or {})}
    fields = {"rope_theta": _rope_theta(rope, hf.get("rope_scaling") or {}, problems)}
    # Qwen3Config drops sliding_window unless use_sliding_window (a sliding layer without one fails there).
    window = hf.get("sliding_window") if hf.get("use_sliding_window") else None
    layers = int(hf["num_hidden_layers"])
    first = layers if window is None else min(max(int(hf.get("max_window_layers", 0)), 0), layers)
    kinds = _kinds(hf["layer_types"]) if hf.get("layer_types") else "L" * first + "S" * (layers - first)
    if hf["model_type"] == "llama" and "S" in kinds:
        sliding = [i for i, kind in enumerate(kinds) if kind == "S"]
        problems.append(
            f"sliding-window attention on layers {sliding} (use_sliding_window / layer_types), which "
            "transformers' Llama does not apply"
        )
        return fields
    return {**fields, **_windows(kinds, window, problems)}


def _gemma3_fields(hf: dict, problems: list[str]) -> dict:
    """Gemma3 text: attention scale, final softcap, and its sliding layers as our windows."""
    if hf.get("attn_logit_softcapping") is not None:
        problems.append(
            f"attn_logit_softcapping={hf['attn_logit_softcapping']} (transformers' Gemma3 attention does "
            "not apply it; only null)"
        )
    if hf.get("use_bidirectional_attention"):
        problems.append("use_bidirectional_attention=true (only causal attention)")
    layers = int(hf["num_hidden_layers"])
    pattern = int(hf.get("_sliding_window_pattern", hf["sliding_window_pattern"]))
    types = hf.get("layer_types") or [
        "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)
    ]
    kinds = _kinds(types)
    # transformers 5: rope_parameters per layer type; 4.x: rope_theta (+ rope_scaling), rope_local_base_freq.
    rope = hf.get("rope_parameters") or {}
    if "full_attention" not in rope:
        rope = {
            "full_attention": {"rope_theta": hf["rope_theta"], **(hf.get("rope_scaling") or {})},
            "sliding_attention": {"rope_theta": hf["rope_local_base_freq"]},
        }
    theta = _rope_theta(rope["full_attention"], {}, problems, " on full-attention layers")
    fields = {
        "rope_theta": theta,
        "query_pre_attn_scalar": float(hf["query_pre_attn_scalar"]),
        "logit_softcap": hf.get("final_logit_softcapping"),
    }
    windows = _windows(kinds, hf.get("sliding_window"), problems)
    if not windows:
        return fields
    local = rope.get("sliding_attention") or {}
    return {
        **fields,
        **windows,
        "rope_local_theta": _rope_theta(local, {}, problems, " on sliding layers"),
    }


def hf_model_type(cfg: ModelConfig) -> str:
    """The HF model type with exactly this model's block; else one ValueError naming the fields in which
    the closest supported type differs."""
    plain = ModelConfig(**{f: getattr(cfg, f) for f in SHAPE_FIELDS})
    differ = {
        name: [
            f"{f}={getattr(cfg, f)!r}"
            for f in BLOCK_FIELDS
            if getattr(cfg, f) != model.block.get(f, getattr(plain, f))
        ]
        for name, model in HF_MODELS.items()
        if model.export is not None
    }
    closest = min(differ, key=lambda name: len(differ[name]))
    if differ[closest]:
        raise ValueError(
            f"no HF model type has this block (closest: {closest!r}, which has no "
            f"{', '.join(differ[closest])}): this model cannot be exported to HF "
            f"(supported: {_supported(n for n, m in HF_MODELS.items() if m.export is not None)})"
        )
    return closest


def hf_config_from_model(cfg: ModelConfig, **extra: Any) -> dict:
    """A config.json that transformers loads unchanged as the model's HF type (LlamaForCausalLM or
    Qwen3ForCausalLM; 4.x and 5.x keys both written). `extra` adds keys, e.g. the tokenizer's bos_token_id /
    eos_token_id / pad_token_id."""
    if cfg.rope_theta is None:
        raise ValueError(
            f"HF {_supported(('llama', 'qwen3'))} have no NoPE variant: a model with rope_theta=None cannot "
            "be exported to HF"
        )
    model_type = hf_model_type(cfg)
    return {
        "architectures": [HF_MODELS[model_type].architecture],
        "model_type": model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.mlp_dim,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_seq_len,
        "initializer_range": cfg.init_std,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_bias": False,
        **HF_MODELS[model_type].export,
        "dtype": cfg.param_dtype,
        **extra,
    }
