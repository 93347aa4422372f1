"""Our own checkpoints, read and written through t2mlr_jax.storage.checkpoint (the one module that talks to
orbax). A model is read from any of:

  an exported folder   `params` and `model_config` items (save_params; what `--to orbax` writes)
  a training step      WORKDIR/checkpoints/<step>: the train state plus a meta record naming the
                       architecture, its model config and tokenizer (the optimizer state is not read)
  a training workdir   WORKDIR (or WORKDIR/checkpoints): its newest step

Registered as the checkpoint format "orbax" (t2mlr_jax.formats.registry).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import jax

from t2mlr_jax.architectures import ARCHITECTURES
from t2mlr_jax.config.convert import model_from_dict, model_to_dict
from t2mlr_jax.formats.files import check_export_target
from t2mlr_jax.formats.registry import FIRST, CheckpointFormat, register_format
from t2mlr_jax.formats.tables import check_params
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.params import init_params
from t2mlr_jax.storage import checkpoint as ckpt
from t2mlr_jax.storage.workdir import CHECKPOINTS, RUN_CONFIG, saved_steps


def save_params(
    path: Path | str,
    cfg: ModelConfig,
    params: dict,
    *,
    tokenizer: str | None = None,
    overwrite: bool = False,
) -> None:
    """An exported folder (what load_params reads). `path` must be new or empty, or with `overwrite` an
    exported folder, which is replaced whole (orbax writes a folder whole)."""
    check_orbax_target(path, overwrite=overwrite)
    check_params(cfg, params)
    metadata = {"model_config": model_to_dict(cfg)}
    if tokenizer:
        metadata["tokenizer"] = {"path": str(tokenizer)}
    if Path(path).exists():  # orbax writes only a new folder
        shutil.rmtree(path)
    ckpt.save_folder(path, params=params, metadata=metadata)


def check_orbax_target(path: Path | str, *, overwrite: bool = False) -> None:
    """`check_export_target`; what `overwrite` may replace is only an exported folder (it goes whole)."""
    check_export_target(path, overwrite=overwrite)
    path = Path(path)
    if path.is_dir() and any(path.iterdir()) and not is_exported_folder(path):
        raise ValueError(
            f"{path} is not empty and not an exported orbax folder (params/ and model_config/): --to orbax "
            "replaces only such a folder, whole; choose a new folder"
        )


def is_exported_folder(path: Path | str) -> bool:
    return (Path(path) / "model_config").is_dir() and (Path(path) / "params").is_dir()


def is_orbax_checkpoint(path: Path | str) -> bool:
    """An exported folder, a training step folder, or a training workdir (possibly without steps yet:
    reading it then says so)."""
    path = Path(path)
    return (
        is_exported_folder(path)
        or ckpt.is_step_folder(path)
        or (path / RUN_CONFIG).exists()
        or (path / CHECKPOINTS).is_dir()
        or bool(_sub_runs(path))
    )


def model_folder(path: Path | str) -> Path:
    """The exported folder or training step folder that `path` names (a workdir: its newest step)."""
    path = Path(path)
    if is_exported_folder(path) or ckpt.is_step_folder(path):
        return path
    checkpoints = path / CHECKPOINTS if (path / CHECKPOINTS).is_dir() else path
    steps = saved_steps(checkpoints)
    if steps:
        return checkpoints / str(steps[-1])
    runs = _sub_runs(path)
    if runs:
        raise ValueError(
            f"{path} holds the runs of several architectures ({', '.join(runs)}): name one, "
            f"e.g. {path / runs[0]}"
        )
    raise ValueError(f"{path} holds no finished checkpoint yet (no {checkpoints}/<step> folder)")


def load_config(path: Path | str) -> ModelConfig:
    """The stored model config alone (no arrays are read)."""
    folder = model_folder(path)
    if is_exported_folder(folder):
        return model_from_dict(ckpt.read_folder_metadata(folder, "model_config"))
    return model_from_dict(_training_meta(folder)["model_config"])


def load_params(path: Path | str) -> tuple[ModelConfig, dict]:
    """(ModelConfig, params); the stored arrays must match the stored config's parameter table."""
    folder = model_folder(path)
    if is_exported_folder(folder):
        cfg = load_config(folder)
        return cfg, ckpt.read_folder_arrays(folder, _param_shapes(cfg))
    meta = _training_meta(folder)
    cfg = model_from_dict(meta["model_config"])
    params = _exporter(meta["arch"])(ckpt.read_step_params(folder))  # the run's params as the backbone's
    if jax.tree.structure(params) != jax.tree.structure(_param_shapes(cfg)):
        raise ValueError(f"{folder}: the stored parameters do not match its model config's parameter table")
    return cfg, params


def _param_shapes(cfg: ModelConfig) -> dict:
    return jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))


def stored_tokenizer(path: Path | str) -> str | None:
    """The tokenizer recorded with the checkpoint (the training run's data.tokenizer, or the source of an
    import), None when none was recorded."""
    folder = model_folder(path)
    if is_exported_folder(folder):
        if not (folder / "tokenizer").is_dir():
            return None
        return ckpt.read_folder_metadata(folder, "tokenizer")["path"]
    return _training_meta(folder).get("tokenizer") or None


def _training_meta(folder: Path) -> dict:
    meta = ckpt.read_folder_metadata(folder, "meta")
    if "arch" not in meta:
        raise ValueError(
            f"{folder}: this checkpoint predates the model record in training checkpoints; resume the run "
            "for one step (it saves a new checkpoint) and read that one"
        )
    if _exporter(meta["arch"]) is None or meta.get("model_config") is None:
        readable = [name for name, entry in ARCHITECTURES.items() if entry.capabilities.export]
        raise ValueError(
            f"{folder}: a checkpoint of the {meta['arch']!r} architecture, which registers no export mapping "
            f"to a transformer backbone; only {' and '.join(sorted(readable))} runs can be read as a model"
        )
    return meta


def _exporter(arch: str):
    """The export mapping `arch` registers (its trained params -> the backbone's), None if it has none."""
    return ARCHITECTURES.get(arch).capabilities.export if arch in ARCHITECTURES else None


def _sub_runs(path: Path) -> list[str]:
    """The per-architecture runs of a multi-architecture workdir (workdir/<arch>/run_config.json)."""
    if not path.is_dir():
        return []
    return sorted(p.name for p in path.iterdir() if (p / RUN_CONFIG).exists())


def export(cfg: ModelConfig, params: dict, path: Path | str, *, tokenizer=None, overwrite: bool = False, **_):
    """`save_params` as a conversion's target: it records the tokenizer's path (a `read_tokenizer` result)."""
    recorded = None if tokenizer is None else str(Path(tokenizer.source).absolute())
    save_params(path, cfg, params, tokenizer=recorded, overwrite=overwrite)


# Our side of every conversion (convert_checkpoint: one side is orbax); checked before the release layouts.
register_format(
    CheckpointFormat(
        "orbax",
        recognises=is_orbax_checkpoint,
        read_config=lambda path, **_: load_config(path),
        load=lambda path, **_: load_params(path),
        save=export,
        priority=FIRST,
        described="an orbax checkpoint",
    )
)
