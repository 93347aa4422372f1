"""Our own exported model: an orbax folder holding the params and the model config (`params`,
`model_config` items), read and written through t2mlr_jax.train.checkpoint, the one module that talks to
orbax."""

from __future__ import annotations

from pathlib import Path

import jax

from t2mlr_jax.interop.configs import config_from_dict, config_to_dict
from t2mlr_jax.interop.tables import check_params
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.params import init_params
from t2mlr_jax.train import checkpoint as ckpt


def save_params(path: Path | str, cfg: ModelConfig, params: dict) -> None:
    check_params(cfg, params)
    ckpt.save_folder(path, params=params, metadata={"model_config": config_to_dict(cfg)})


def load_config(path: Path | str) -> ModelConfig:
    """The stored model config alone (no arrays are read)."""
    return config_from_dict(ckpt.read_folder_metadata(path, "model_config"))


def load_params(path: Path | str) -> tuple[ModelConfig, dict]:
    """(ModelConfig, params); the stored arrays must match the stored config's parameter table."""
    cfg = load_config(path)
    return cfg, ckpt.read_folder_arrays(path, jax.eval_shape(lambda: init_params(cfg, jax.random.key(0))))


def is_orbax_checkpoint(path: Path | str) -> bool:
    return (Path(path) / "model_config").is_dir() and (Path(path) / "params").is_dir()
