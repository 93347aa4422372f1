"""One entry point for any supported checkpoint, and turning a pretrained transformer into T²MLR."""

from __future__ import annotations

import contextlib
import dataclasses
import math
from pathlib import Path

import jax
import jax.numpy as jnp

from t2mlr_jax.architectures.t2mlr import MIXERS, RecurrenceConfig, mixer_specs
from t2mlr_jax.interop.configs import BLOCK_FIELDS, model_config_from_hf
from t2mlr_jax.interop.files import check_weight_files, one_line, read_json, torch_state
from t2mlr_jax.interop.gguf import gguf_model_config, load_gguf, open_gguf
from t2mlr_jax.interop.hf import load_hf
from t2mlr_jax.interop.nanochat import (
    checkpoint_files,
    is_nanochat_checkpoint,
    load_nanochat,
    nanochat_config,
)
from t2mlr_jax.interop.orbax_folder import is_orbax_checkpoint, load_config, load_params, stored_tokenizer
from t2mlr_jax.interop.ponderlm2_release import (
    is_ponderlm2_release,
    load_ponderlm2_release,
    ponderlm2_model_config,
)
from t2mlr_jax.interop.release_config import model_config_from_release
from t2mlr_jax.interop.t2mlr_torch import is_t2mlr_folder, load_t2mlr_torch
from t2mlr_jax.model.config import SHAPE_FIELDS, ModelConfig
from t2mlr_jax.model.spec import init_from_specs

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
# Mixers for which Phi(x, R) == x at initialisation (the gammas start at 0), so retrofitting keeps the logits.
IDENTITY_AT_INIT = tuple(name for name, mixer in MIXERS.items() if mixer.rezero) + ("none",)


def checkpoint_format(path: Path | str) -> str:
    """'gguf', 'orbax', 't2mlr-torch', 'nanochat', 'ponderlm2' (PonderLM-2's release: an HF Llama folder
    with its pondering fields) or 'hf', recognised by the contents at `path`."""
    path = Path(path)
    if path.is_file() and path.suffix == ".gguf":
        return "gguf"
    if is_orbax_checkpoint(path):
        return "orbax"
    if is_t2mlr_folder(path):
        return "t2mlr-torch"
    if is_nanochat_checkpoint(path):
        return "nanochat"
    if is_ponderlm2_release(path):
        return "ponderlm2"
    if (path / "config.json").exists():
        return "hf"
    raise ValueError(
        f"{path}: not a .gguf file, an orbax checkpoint, a nanochat checkpoint (model_<step>.pt with its "
        "meta_<step>.json) or a folder with a config.json"
    )


def load_pretrained(
    path_or_gguf: Path | str, *, param_dtype: str = "float32", progress: bool = False
) -> tuple[ModelConfig, dict]:
    """(ModelConfig, params) from a .gguf file, an HF Llama folder, the authors' T²MLR folder, a nanochat
    checkpoint folder (karpathy/nanochat, the LRT release) or our orbax checkpoint, recognised by their
    contents. `param_dtype` applies to the PyTorch and GGUF formats."""
    load = {
        "gguf": load_gguf,
        "t2mlr-torch": load_t2mlr_torch,
        "nanochat": load_nanochat,
        "ponderlm2": load_ponderlm2_backbone,
        "hf": load_hf,
    }.get(checkpoint_format(path_or_gguf))
    return (
        load(path_or_gguf, param_dtype=param_dtype, progress=progress) if load else load_params(path_or_gguf)
    )


def pretrained_config(path_or_gguf: Path | str, *, param_dtype: str = "float32") -> ModelConfig:
    """The ModelConfig `load_pretrained` would return, read without the weights (seconds, not minutes).
    The weight files are checked too, from their headers, so that a checkpoint whose weights would fail to
    load (a cut-short download, a .bin that is not plain tensors) is refused here, when a run is built,
    rather than after its workdir is written. Every refusal is one ValueError line naming the file."""
    fmt = checkpoint_format(path_or_gguf)
    if fmt == "orbax":
        return load_config(path_or_gguf)
    if fmt == "gguf":
        reader = open_gguf(path_or_gguf)
        with _naming(path_or_gguf):
            return gguf_model_config(reader, param_dtype=param_dtype)
    if fmt == "nanochat":
        model_file, meta = checkpoint_files(path_or_gguf)
        torch_state(model_file, mmap=True)  # a file that would fail to load is refused now
        with _naming(meta):
            return nanochat_config(path_or_gguf, param_dtype=param_dtype)
    check_weight_files(path_or_gguf)
    config_file = Path(path_or_gguf) / "config.json"
    config = read_json(config_file)
    from_json = {"t2mlr-torch": model_config_from_release, "ponderlm2": ponderlm2_model_config}.get(
        fmt, model_config_from_hf
    )
    with _naming(config_file):
        return from_json(config, param_dtype=param_dtype)


def load_ponderlm2_backbone(path: Path | str, **kwargs) -> tuple[ModelConfig, dict]:
    """PonderLM-2's release folder as (its Llama backbone, params); its settings: load_ponderlm2_release."""
    cfg, params, _ = load_ponderlm2_release(path, **kwargs)
    return cfg, params


@contextlib.contextmanager
def _naming(source: Path | str):
    """A config that does not convert is refused naming its file (a KeyError is a field it lacks)."""
    try:
        yield
    except KeyError as e:
        raise ValueError(f"{source}: no {e} field") from None
    except (ValueError, TypeError) as e:  # one line: some list their problems one per line
        raise ValueError(f"{source}: {one_line(e)}") from None


def retrofit(
    cfg: ModelConfig, params: dict, recurrence: RecurrenceConfig, key: jax.Array
) -> tuple[ModelConfig, dict]:
    """A pretrained plain transformer plus fresh fusion parameters with γ = 0: the T²MLR model it gives
    computes exactly the original logits until training moves the gammas."""
    if cfg.recurrence is not None:
        raise ValueError("retrofit: the model already has a recurrence")
    check_retrofittable(recurrence)
    cfg = cfg.replace(recurrence=recurrence)
    mixer = init_from_specs(mixer_specs(cfg), key, cfg.param_dtype)
    # γ = 0 by construction, not by relying on the initialiser.
    mixer = {
        name: jnp.zeros_like(value) if name.startswith("rezero_gamma") else value
        for name, value in mixer.items()
    }
    return cfg, {**params, "mixer": mixer}


def check_retrofittable(recurrence: RecurrenceConfig) -> None:
    if recurrence.mixer not in IDENTITY_AT_INIT:
        raise ValueError(
            f"retrofit: mixer {recurrence.mixer!r} is not the identity at initialisation, so it "
            f"would change the pretrained model; choose one of {IDENTITY_AT_INIT}"
        )
    if recurrence.gamma_recurrent_init:
        raise ValueError(
            f"retrofit: recurrence.gamma_recurrent_init={recurrence.gamma_recurrent_init} would change the "
            "pretrained model at init (retrofitting starts every gamma at 0); leave it at 0"
        )


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
