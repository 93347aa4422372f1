"""Configuration conversion (pure Python, no JAX): HF Llama / Qwen3 config.json <-> `ModelConfig` (Gemma3
text: import only), the authors' T²MLR settings <-> `RecurrenceConfig`, and `ModelConfig` <-> a JSON-able
dict for our own checkpoints.

Every importer refuses settings it cannot reproduce exactly, listing all of them in one ValueError,
rather than loading a model that silently computes something else.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from t2mlr_jax.model.config import SHAPE_FIELDS, ModelConfig, RecurrenceConfig
from t2mlr_jax.model.mixers import MIXERS

# ---------------------------------------------------------------------------------------------
# Our own checkpoints: the config as a plain dict (stored next to the weights).


def config_to_dict(cfg: ModelConfig) -> dict:
    return dataclasses.asdict(cfg)


def config_from_dict(data: dict) -> ModelConfig:
    data = dict(data)
    rec = data.pop("recurrence", None)
    for cls, fields in ((ModelConfig, data), (RecurrenceConfig, rec or {})):
        unknown = set(fields) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown fields {sorted(unknown)} in the stored config")
    return ModelConfig(**data, recurrence=None if rec is None else RecurrenceConfig(**rec)).validate()


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
                "norm_offset", "embed_scale", "sandwich_norms", "query_pre_attn_scalar",
                "rope_local_theta")  # fmt: skip


def _raise_if(problems: list[str], what: str) -> None:
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
    _raise_if(problems, f"HF {model_type} config")
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
    ).validate()


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


# ---------------------------------------------------------------------------------------------
# The authors' T²MLR settings (their T2MLRSettings dataclass, stored flat in config.json).

# Release name <-> our field, where the meaning is identical.
SETTINGS = {
    "l_start": "l_start",
    "l_end": "l_end",
    "use_recurrent_projection": "recurrent_projection",
    "gate_weight_init_std": "gate_weight_init_std",
    "recurrent_gate_init": "recurrent_gate_init",
    "input_gate_init": "input_gate_init",
    "recurrent_alpha": "constant_alpha",
    "pre_norm_streams": "pre_norm",
    "post_norm": "post_norm",
    "post_norm_clamp": "post_norm_clamp",
    "recurrent_residual_to_recurrent_cache": "temporal_residual",
    "recurrent_residual_to_recurrent_cache_weight": "temporal_residual_weight",
    "recurrent_residual_to_recurrent_cache_detach": "temporal_residual_detach",
    "recurrent_residual_to_recurrent_cache_post_norm_clamp": "cache_norm_clamp",
    "recurrent_residual_to_recurrent_cache_post_norm_eps": "cache_norm_eps",
    "batch_forward_approximate_depth": "d_forward",
    "batch_backward_approximate_depth": "d_backward",
}
# The release's defaults (T2MLRSettings) for what a config.json may omit; they differ from ours.
RELEASE_DEFAULTS = {
    "l_start": 0,
    "l_end": -1,
    "recurrent_mixing_module_name": "none",
    "use_recurrent_projection": False,
    "gate_weight_init_std": 1e-3,
    "recurrent_gate_init": 0.2,
    "input_gate_init": 0.8,
    "recurrent_alpha": 0.5,
    "pre_norm_streams": False,
    "post_norm": False,
    "post_norm_clamp": 5.0,
    "recurrent_residual_to_recurrent_cache": False,
    "recurrent_residual_to_recurrent_cache_weight": 1.0,
    "recurrent_residual_to_recurrent_cache_detach": False,
    "recurrent_residual_to_recurrent_cache_post_norm": False,
    "recurrent_residual_to_recurrent_cache_post_norm_clamp": 5.0,
    "recurrent_residual_to_recurrent_cache_post_norm_eps": 1e-6,
    "batch_forward_approximate_depth": 1,
    "batch_backward_approximate_depth": 10_000_000,
}
# Mixer names that differ between the release's registry and ours.
RELEASE_MIXER_NAMES = {"coconut": "baseline_coconut", "codi": "baseline_codi"}
# The release's `gated` with both gates not learnable (use_learnable_gate=False: no gate projections, fixed
# gates 1 and 0) is our `gated_fixed`; with both learnable it is our `gated`.
FIXED_GATED = "gated_fixed"
# Settings (T2MLRSettings fields) and mixer-module kwargs whose other values change the forward pass in
# ways we do not implement; these values are the release's defaults.
NEUTRAL_SETTINGS = {
    "t2mlr_enabled": True,
    "recurrent_skip_to_l_end": False,
    "pre_norm_type": "rmsnorm",
    "post_norm_eps": 1e-6,
    "normalize_gates": False,
    "gate_proj_type": "linear",
    "concat_recurrent": False,
}
NEUTRAL_MODULE_KWARGS = {
    "disable_x_branch": False,
    "use_rezero_residual": True,
    "exponential_rotational_gate_c_value": 8.0,
    "exponential_rotational_gate_sqrt_eps": 1e-8,
}
# Accepted mixing_module_kwargs (anything else is refused): per-channel gammas, CODI's width, the neutral
# ones.
MIXER_KWARGS = ("rezero_gamma_scalar", "bottleneck_size", *NEUTRAL_SETTINGS, *NEUTRAL_MODULE_KWARGS)


def _learnable_gates(settings: dict, mixer: str) -> dict:
    """The release builds gate projections only when these flags are on."""
    if mixer == "gated":
        default = settings.get("use_learnable_gate", False)
        return {
            name: settings.get(name) if settings.get(name) is not None else default
            for name in ("use_learnable_recurrent_gate", "use_learnable_input_gate")
        }
    if MIXERS.get(mixer).rezero:
        return {"use_learnable_gate": settings.get("use_learnable_gate", False)}
    return {}


def recurrence_from_release(settings: dict, hidden_size: int) -> RecurrenceConfig:
    """Our `RecurrenceConfig` from the release's flat settings (its config.json minus the base config)."""
    kwargs = settings.get("mixing_module_kwargs") or {}
    merged = {**RELEASE_DEFAULTS, **settings, **kwargs}  # module kwargs override settings, as in the release
    release_mixer = merged["recurrent_mixing_module_name"]
    mixer = {v: k for k, v in RELEASE_MIXER_NAMES.items()}.get(release_mixer, release_mixer)
    gates = _learnable_gates(merged, mixer)
    if mixer == "gated" and not any(gates.values()):
        mixer, gates = FIXED_GATED, {}
    problems = [f"mixing_module_kwargs.{k} is not supported" for k in kwargs if k not in MIXER_KWARGS]
    problems += [
        f"{name}={merged[name]!r} (only {value!r} is supported)"
        for name, value in {**NEUTRAL_SETTINGS, **NEUTRAL_MODULE_KWARGS}.items()
        if name in merged and merged[name] != value
    ]
    ours_has = f"ours has both ({mixer}) or neither ({FIXED_GATED})" if mixer == "gated" else "ours learns it"
    problems += [
        f"{name}=False: the release then has no gate projection, {ours_has}"
        for name, on in gates.items()
        if not on
    ]
    if merged.get("recurrent_state_proj_type", "auto") not in ("auto", "linear"):
        problems.append(
            f"recurrent_state_proj_type={merged['recurrent_state_proj_type']!r} (only a linear W_rec)"
        )
    if merged.get("recurrent_projection_dim") not in (None, hidden_size):
        problems.append(f"recurrent_projection_dim={merged['recurrent_projection_dim']} (only hidden_size)")
    if mixer == "codi" and not (
        isinstance(merged.get("bottleneck_size"), int) and merged["bottleneck_size"] > 0
    ):
        problems.append(
            f"CODI needs a positive integer bottleneck_size, got {merged.get('bottleneck_size')!r}"
        )
    _raise_if(problems, "T²MLR release settings")
    fields = {ours: merged[theirs] for theirs, ours in SETTINGS.items()}
    # The release's B >= D (its default B is 10,000,000) is the gradient through every pass: R<1> attached,
    # no refinement pass detached. Ours says that as B = D; a B < D means the same on both sides. Its
    # connection_detach detaches R<1> and every pass, which is B = 0 (in its Jacobi forward; its exact one
    # then also cuts R's gradient through time, which ours has no setting for).
    detached = merged.get("connection_detach", False)
    fields["d_backward"] = 0 if detached else min(fields["d_backward"], fields["d_forward"])
    residual_norm = merged["recurrent_residual_to_recurrent_cache_post_norm"]
    return RecurrenceConfig(
        **fields,
        mixer=mixer,
        cache_norm="rescale" if residual_norm else "none",
        gamma_per_channel=not merged.get("rezero_gamma_scalar", True),
        # None (= hidden_size) when it is the hidden size, so a round trip gives back the same config
        bottleneck_size=None
        if mixer != "codi" or merged["bottleneck_size"] == hidden_size
        else merged["bottleneck_size"],
    )


def release_from_recurrence(rec: RecurrenceConfig, hidden_size: int) -> dict:
    """The release's flat settings for our `RecurrenceConfig` (inverse of `recurrence_from_release`). Our
    B <= D is written as it is: the release reads B = D as every pass, as ours does."""
    if rec.cache_norm == "rmsnorm":
        raise ValueError(
            "cache_norm='rmsnorm' (the paper's learnable RMSNorm) has no equivalent in the release"
        )
    kwargs = {}
    if rec.gamma_per_channel and MIXERS.get(rec.mixer).rezero:
        kwargs["rezero_gamma_scalar"] = False
    if rec.mixer == "codi":
        kwargs["bottleneck_size"] = rec.bottleneck_size or hidden_size
    fixed = rec.mixer == FIXED_GATED
    return {
        **{theirs: getattr(rec, ours) for theirs, ours in SETTINGS.items()},
        **NEUTRAL_SETTINGS,
        "recurrent_mixing_module_name": "gated" if fixed else RELEASE_MIXER_NAMES.get(rec.mixer, rec.mixer),
        "recurrent_residual_to_recurrent_cache_post_norm": rec.cache_norm == "rescale",
        **dict.fromkeys(
            ("use_learnable_gate", "use_learnable_recurrent_gate", "use_learnable_input_gate"), not fixed
        ),
        "recurrent_state_proj_type": "linear",
        "recurrent_projection_dim": None,
        "mixing_module_kwargs": kwargs or None,
    }


# ---------------------------------------------------------------------------------------------
# The release's whole config.json (T2MLRConfig): the base Llama config plus the flat settings.

MODEL_TYPE = "t2mlr"
RELEASE_BASE = "llama"  # the release wraps (and its torch reference rebuilds) an HF Llama
# Keys of the release's config.json that are not T²MLR settings.
WRAPPER_KEYS = (
    "base_config",
    "base_model_type",
    "model_type",
    "architectures",
    "dtype",
    "torch_dtype",
    "transformers_version",
    "_name_or_path",
)


def model_config_from_release(config: dict, *, param_dtype: str = "float32") -> ModelConfig:
    """Our config from the release's config.json (its base Llama config plus its flat settings)."""
    if config.get("model_type") != MODEL_TYPE or not isinstance(config.get("base_config"), dict):
        raise ValueError(
            f"not a T²MLR release config: model_type={config.get('model_type')!r}, "
            f"base_config {'present' if 'base_config' in config else 'absent'}"
        )
    base = model_config_from_hf(config["base_config"], param_dtype=param_dtype, model_types=(RELEASE_BASE,))
    settings = {k: v for k, v in config.items() if k not in WRAPPER_KEYS}
    return base.replace(recurrence=recurrence_from_release(settings, base.hidden_size)).validate()


def release_config(cfg: ModelConfig, **token_ids: int | None) -> dict:
    """The release's config.json. `token_ids` (bos/eos/pad_token_id) go both into the base config, which
    builds the wrapped Llama, and to the top, where the wrapper's own PretrainedConfig reads them."""
    l_start, l_end = cfg.layer_range
    if l_end <= l_start:
        raise ValueError(f"the release requires l_start < l_end, got block range ({l_start}, {l_end})")
    base = hf_config_from_model(cfg.replace(recurrence=None), **token_ids)
    if base["model_type"] != RELEASE_BASE:
        raise ValueError(
            f"the release wraps HF {RELEASE_BASE!r} only, this backbone is {base['model_type']!r}"
        )
    return {
        "model_type": MODEL_TYPE,
        "architectures": ["T2MLRWrapper"],
        "base_model_type": RELEASE_BASE,
        "base_config": base,
        "dtype": cfg.param_dtype,
        **token_ids,
        **release_from_recurrence(cfg.recurrence, cfg.hidden_size),
    }
