"""One entry point for any supported checkpoint: the registered checkpoint formats
(t2mlr_jax.formats.registry), every one of them imported, recognised by their contents."""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path

from t2mlr_jax.architectures import import_systems
from t2mlr_jax.formats.configs import BLOCK_FIELDS
from t2mlr_jax.formats.registry import CheckpointFormat, import_formats, recognise
from t2mlr_jax.interop.orbax_folder import is_orbax_checkpoint, stored_tokenizer
from t2mlr_jax.model.config import SHAPE_FIELDS, ModelConfig
from t2mlr_jax.registry import Registry

# What a backbone's weights encode: a checkpoint fits a model config when these agree.
BACKBONE_FIELDS = (*SHAPE_FIELDS, *BLOCK_FIELDS, "rope_theta", "norm_eps", "tie_embeddings")
# Recurrence fields that shape only the start of training (init draws, default Jacobi depths), not the
# function.
START_ONLY_FIELDS = (
    "d_forward",
    "d_backward",
    "gate_weight_init_std",
    "recurrent_gate_init",
    "input_gate_init",
    "gamma_recurrent_init",
)


@functools.cache
def formats() -> Registry:
    """FORMATS with every format registered: this package's generic ones, the systems' release layouts
    (registered when the systems are found) and our orbax checkpoints (orbax_folder, imported above); found
    once."""
    import_systems()
    return import_formats()


def format_of(path: Path | str) -> CheckpointFormat:
    formats()
    return recognise(path)


def checkpoint_format(path: Path | str) -> str:
    """The name of the registered format whose checkpoints `path` looks like ('gguf', 'orbax', 'hf', a
    release's: 't2mlr-torch', 'nanochat', 'ponderlm2', ...)."""
    return format_of(path).name


def load_pretrained(
    path_or_gguf: Path | str, *, param_dtype: str = "float32", progress: bool = False
) -> tuple[ModelConfig, dict]:
    """(ModelConfig, params) from any registered format: a .gguf file, an HF Llama folder, the authors' T²MLR
    folder, a nanochat checkpoint folder (karpathy/nanochat, the LRT release), PonderLM-2's release (its
    backbone) or our orbax checkpoint, recognised by their contents. `param_dtype` applies to the PyTorch
    and GGUF formats."""
    return format_of(path_or_gguf).load(path_or_gguf, param_dtype=param_dtype, progress=progress)


def pretrained_config(path_or_gguf: Path | str, *, param_dtype: str = "float32") -> ModelConfig:
    """The ModelConfig `load_pretrained` would return, read without the weights (seconds, not minutes).
    The weight files are checked too, from their headers, so that a checkpoint whose weights would fail to
    load (a cut-short download, a .bin that is not plain tensors) is refused here, when a run is built,
    rather than after its workdir is written. Every refusal is one ValueError line naming the file."""
    return format_of(path_or_gguf).read_config(path_or_gguf, param_dtype=param_dtype)


def mismatches(checkpoint: ModelConfig, model: ModelConfig) -> list[str]:
    """Where a checkpoint's model differs from `model` in what its weights compute ("field: a vs b"). The
    backbone always counts; the recurrence only when the checkpoint has one (a plain one is retrofitted)."""
    pairs = [(name, getattr(checkpoint, name), getattr(model, name)) for name in BACKBONE_FIELDS]
    if checkpoint.recurrence is not None:
        if model.recurrence is None:
            pairs.append(("recurrence", checkpoint.recurrence, None))
        else:
            stored, wanted = (
                dataclasses.asdict(dataclasses.replace(cfg.recurrence, l_end=cfg.layer_range[1]))
                for cfg in (checkpoint, model)
            )
            pairs += [(f"recurrence.{k}", stored[k], wanted[k]) for k in stored if k not in START_ONLY_FIELDS]
    return [f"{name}: {a!r} (checkpoint) vs {b!r} (config)" for name, a, b in pairs if not _same(a, b)]


def _same(a, b) -> bool:
    # float32 metadata round-trips: GGUF stores norm_eps 1e-5 as 9.99999975e-06.
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-6)
    return a == b


def recorded_tokenizer(path: Path | str) -> str | None:
    """The tokenizer a checkpoint was made with, when the checkpoint says: a .gguf file carries its own, an
    HF folder may hold tokenizer.json, our checkpoints record it; None when the source does not tell."""
    path = Path(path)
    if path.is_file() and path.suffix == ".gguf":
        return str(path)
    if is_orbax_checkpoint(path):
        return stored_tokenizer(path)
    if (path / "tokenizer.json").exists():
        return str(path)
    return None
