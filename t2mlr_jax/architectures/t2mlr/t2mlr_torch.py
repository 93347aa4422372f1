"""The authors' PyTorch T²MLR layout (T2MLRWrapper.save_pretrained) <-> our (ModelConfig, params).

config.json: model_type "t2mlr", the Llama config under `base_config`, the T²MLR settings flat.
Weights: the Llama keys under `t2mlr_model.`, block l_start under `...layers.{l_start}.model.`
and the mixer under `...layers.{l_start}.t2mlr_mixing_module.` (see mixer_rules). Registered as the
checkpoint format "t2mlr-torch" when the systems are found (architecture.py imports this module).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from t2mlr_jax.architectures.t2mlr.mixers import MIXERS, SHARED_KEYS
from t2mlr_jax.architectures.t2mlr.release_configs import (
    MODEL_TYPE,
    model_config_from_release,
    release_config,
)
from t2mlr_jax.formats.files import check_export_target, read_json, read_state_dict
from t2mlr_jax.formats.hf import write_folder
from t2mlr_jax.formats.registry import CheckpointFormat, folder_config, register_format
from t2mlr_jax.formats.tables import (
    LLAMA_RULES,
    Rule,
    StateDictLayout,
    from_state_dict,
    select_rules,
    to_state_dict,
)
from t2mlr_jax.formats.tokenizer_files import ExportTokenizer, export_tokenizer, token_ids
from t2mlr_jax.model.config import ModelConfig

_MIXER = "model.layers.{l_start}.t2mlr_mixing_module."


def mixer_rules(mixer: str) -> tuple[Rule, ...]:
    """The release's keys (its t2mlr_gate_zoo modules) of every parameter a mixer may have: the shared W_rec
    and pre-norm scales and the mixer's own, from its registry entry."""
    keys = {**SHARED_KEYS, **MIXERS.get(mixer).keys}
    return tuple(Rule(("mixer", *path), _MIXER + key) for path, key in keys.items())


def t2mlr_layout(cfg: ModelConfig) -> StateDictLayout:
    """The authors' T2MLRWrapper state dict: the Llama keys under `t2mlr_model.`, block l_start wrapped."""
    l_start, _ = cfg.layer_range
    rules = LLAMA_RULES + mixer_rules(cfg.recurrence.mixer)
    return select_rules("t2mlr-torch", cfg, rules, prefix="t2mlr_model.", wrapped_block=l_start)


def is_t2mlr_folder(path: Path | str) -> bool:
    config = Path(path) / "config.json"
    return config.exists() and read_json(config).get("model_type") == MODEL_TYPE


def load_t2mlr_torch(
    path: Path | str, *, param_dtype: str = "float32", progress: bool = False
) -> tuple[ModelConfig, dict]:
    cfg = model_config_from_release(read_json(Path(path) / "config.json"), param_dtype=param_dtype)
    return cfg, from_state_dict(t2mlr_layout(cfg), read_state_dict(path), progress=progress)


def save_t2mlr_torch(
    cfg: ModelConfig,
    params: dict,
    path: Path | str,
    *,
    tokenizer: ExportTokenizer | Path | str | None = None,
    progress: bool = False,
    overwrite: bool = False,
) -> None:
    """Write the release's layout, with the tokenizer files (the release loads them with AutoTokenizer
    from the same folder) when `tokenizer` is given (as for `save_hf`). Everything is checked before the
    first file is written; `path` must be new or empty unless `overwrite` (as for `save_hf`)."""
    check_export_target(path, overwrite=overwrite)
    if cfg.recurrence is None:
        raise ValueError(
            "save_t2mlr_torch needs a T²MLR model (recurrence=None here); use save_hf for a "
            "plain transformer, or retrofit() it first"
        )
    tokenizer = export_tokenizer(tokenizer, cfg.vocab_size)
    config = release_config(cfg, **token_ids(tokenizer))
    state = to_state_dict(t2mlr_layout(cfg), params, progress=progress)
    write_folder(path, state, config, tokenizer, cfg.max_seq_len)


def reference(path: Path):
    from t2mlr_jax.architectures.t2mlr.torch_reference import T2MLRReference

    return T2MLRReference.from_pretrained(path)


def refuses_model(cfg: ModelConfig) -> str | None:
    if cfg.recurrence is None:
        return "a plain transformer and the T²MLR layout needs a recurrence: use --to hf"
    return None


register_format(
    CheckpointFormat(
        "t2mlr-torch",
        recognises=is_t2mlr_folder,
        read_config=partial(folder_config, model_config_from_release),
        load=load_t2mlr_torch,
        save=save_t2mlr_torch,
        refuses_model=refuses_model,
        torch_model=reference,
    )
)
