"""HF Llama-family folders (config.json + weights) <-> our (ModelConfig, params)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from t2mlr_jax.formats.configs import hf_config_from_model, model_config_from_hf
from t2mlr_jax.formats.files import (
    check_export_target,
    clear_model_files,
    read_json,
    read_state_dict,
    write_json,
    write_state_dict,
)
from t2mlr_jax.formats.registry import (
    CATCH_ALL,
    CheckpointFormat,
    folder_config,
    holds_no_recurrence,
    register_format,
)
from t2mlr_jax.formats.tables import from_state_dict, hf_layout, to_state_dict
from t2mlr_jax.formats.tokenizer_files import (
    ExportTokenizer,
    export_tokenizer,
    token_ids,
    write_tokenizer_files,
)
from t2mlr_jax.model.config import ModelConfig


def load_hf(
    path: Path | str, *, param_dtype: str = "float32", progress: bool = False
) -> tuple[ModelConfig, dict]:
    """A transformers LlamaForCausalLM folder (single or sharded safetensors, or .bin) as our params."""
    cfg = model_config_from_hf(read_json(Path(path) / "config.json"), param_dtype=param_dtype)
    return cfg, from_state_dict(hf_layout(cfg), read_state_dict(path), progress=progress)


def save_hf(
    cfg: ModelConfig,
    params: dict,
    path: Path | str,
    *,
    drop_recurrence: bool = False,
    tokenizer: ExportTokenizer | Path | str | None = None,
    progress: bool = False,
    overwrite: bool = False,
) -> None:
    """Write a folder transformers' LlamaForCausalLM loads unchanged, with the tokenizer files and a
    generation config when `tokenizer` is given (a .gguf, a tokenizer.json or its folder, or what
    `read_tokenizer` made of one).

    A T²MLR model has no HF equivalent; `drop_recurrence=True` exports its backbone (the mixer is
    dropped, so the result computes the model at γ=0). Use `save_t2mlr_torch` to keep the recurrence.
    Everything is checked before the first file is written. `path` must be new or empty, unless
    `overwrite`: then the model files in it are replaced (files.MODEL_FILES; others stay).
    """
    check_export_target(path, overwrite=overwrite)
    if cfg.recurrence is not None and not drop_recurrence:
        raise ValueError(
            "this is a T²MLR model: HF Llama cannot hold its recurrence. Export it with "
            "save_t2mlr_torch, or pass drop_recurrence=True to export the backbone alone"
        )
    backbone = (
        params
        if cfg.recurrence is None
        else {name: value for name, value in params.items() if name != "mixer"}
    )
    layout = hf_layout(cfg)
    tokenizer = export_tokenizer(tokenizer, cfg.vocab_size)
    config = hf_config_from_model(layout.cfg, **token_ids(tokenizer))
    write_folder(path, to_state_dict(layout, backbone, progress=progress), config, tokenizer, cfg.max_seq_len)


def write_folder(
    path: Path | str, state: dict, config: dict, tokenizer: ExportTokenizer | None, max_length: int
) -> None:
    """An exported folder's files (HF or the release's layout): the weights, config.json and, with a
    tokenizer, its files and generation_config.json, in place of an earlier model's (`check_export_target`
    has allowed the folder)."""
    path = Path(path)
    clear_model_files(path)
    write_state_dict(path, state)
    write_json(path / "config.json", config)
    if tokenizer:
        write_tokenizer_files(path, tokenizer, max_length)


def transformers_model(**where):
    """transformers' model of a folder or GGUF file, in float32, for --verify."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32).eval()


register_format(
    CheckpointFormat(
        "hf",
        recognises=lambda path: (path / "config.json").exists(),
        read_config=partial(folder_config, model_config_from_hf),
        load=load_hf,
        save=save_hf,
        refuses_model=holds_no_recurrence("hf"),
        backbone_only=True,
        torch_model=lambda path: transformers_model(pretrained_model_name_or_path=path),
        priority=CATCH_ALL,
        described="a folder with a config.json",
    )
)
