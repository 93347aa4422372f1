"""The authors' T²MLR release config (pure Python, no JAX): their settings (the T2MLRSettings dataclass,
stored flat in config.json) <-> our `RecurrenceConfig`, and their whole config.json (T2MLRConfig: a base
HF Llama config plus the flat settings) <-> our `ModelConfig`.

Every importer refuses settings it cannot reproduce exactly, listing all of them in one ValueError,
rather than loading a model that silently computes something else.
"""

from __future__ import annotations

from t2mlr_jax.architectures.t2mlr import MIXERS, RecurrenceConfig
from t2mlr_jax.formats.configs import hf_config_from_model, model_config_from_hf, refuse
from t2mlr_jax.model.config import ModelConfig

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
    refuse(problems, "T²MLR release settings")
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


def model_config_from_release(fields: dict, *, param_dtype: str = "float32") -> ModelConfig:
    """Our config from the release's config.json (its base Llama config plus its flat settings)."""
    if fields.get("model_type") != MODEL_TYPE or not isinstance(fields.get("base_config"), dict):
        raise ValueError(
            f"not a T²MLR release config: model_type={fields.get('model_type')!r}, "
            f"base_config {'present' if 'base_config' in fields else 'absent'}"
        )
    base = model_config_from_hf(fields["base_config"], param_dtype=param_dtype, model_types=(RELEASE_BASE,))
    settings = {k: v for k, v in fields.items() if k not in WRAPPER_KEYS}
    return base.replace(recurrence=recurrence_from_release(settings, base.hidden_size))


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
