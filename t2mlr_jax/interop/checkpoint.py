"""Our own checkpoint: an orbax directory holding {'params': pytree, 'model_config': json}.

Kept to one small save/load pair so the training checkpoint module can replace it later.
"""

from __future__ import annotations

from pathlib import Path

import jax

from t2mlr_jax.interop.configs import config_from_dict, config_to_dict
from t2mlr_jax.interop.tables import check_params
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.params import init_params


def save_params(path: Path | str, cfg: ModelConfig, params: dict) -> None:
    import orbax.checkpoint as ocp

    check_params(cfg, params)
    with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as checkpointer:
        checkpointer.save(
            Path(path).absolute(),
            args=ocp.args.Composite(
                params=ocp.args.StandardSave(params), model_config=ocp.args.JsonSave(config_to_dict(cfg))
            ),
        )


def load_config(path: Path | str) -> ModelConfig:
    """The stored model config alone (no arrays are read)."""
    import orbax.checkpoint as ocp

    with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as checkpointer:
        stored = checkpointer.restore(
            Path(path).absolute(), args=ocp.args.Composite(model_config=ocp.args.JsonRestore())
        )
    return config_from_dict(stored["model_config"])


def load_params(path: Path | str) -> tuple[ModelConfig, dict]:
    """(ModelConfig, params); the stored arrays must match the stored config's parameter table."""
    import orbax.checkpoint as ocp

    path = Path(path).absolute()
    cfg = load_config(path)
    with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as checkpointer:
        target = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
        params = checkpointer.restore(path, args=ocp.args.Composite(params=ocp.args.StandardRestore(target)))[
            "params"
        ]
    return cfg, params


def is_orbax_checkpoint(path: Path | str) -> bool:
    return (Path(path) / "model_config").is_dir() and (Path(path) / "params").is_dir()
