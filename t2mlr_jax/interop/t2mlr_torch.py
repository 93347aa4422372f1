"""The authors' PyTorch T²MLR layout (T2MLRWrapper.save_pretrained) <-> our (ModelConfig, params).

config.json: model_type "t2mlr", the Llama config under `base_config`, the T²MLR settings flat.
Weights: the Llama keys under `t2mlr_model.`, block l_start under `...layers.{l_start}.model.`
and the mixer under `...layers.{l_start}.t2mlr_mixing_module.` (see tables.mixer_rules).
"""

from __future__ import annotations

from pathlib import Path

from t2mlr_jax.interop.files import check_export_target, read_json, read_state_dict
from t2mlr_jax.interop.hf import write_folder
from t2mlr_jax.interop.release_config import MODEL_TYPE, model_config_from_release, release_config
from t2mlr_jax.interop.tables import from_state_dict, t2mlr_layout, to_state_dict
from t2mlr_jax.interop.tokenizer_files import ExportTokenizer, export_tokenizer, token_ids
from t2mlr_jax.model.config import ModelConfig


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
