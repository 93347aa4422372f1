"""HF Llama-family folders (config.json + weights) <-> our (ModelConfig, params)."""

from __future__ import annotations

from pathlib import Path

from t2mlr_jax.interop.configs import hf_config_from_model, model_config_from_hf
from t2mlr_jax.interop.files import read_json, read_state_dict, write_json, write_state_dict
from t2mlr_jax.interop.tables import from_state_dict, hf_layout, to_state_dict
from t2mlr_jax.model.config import ModelConfig


def load_hf(
    path: Path | str, *, param_dtype: str = "float32", progress: bool = False
) -> tuple[ModelConfig, dict]:
    """A transformers LlamaForCausalLM folder (single or sharded safetensors, or .bin) as our params."""
    cfg = model_config_from_hf(read_json(Path(path) / "config.json"), param_dtype=param_dtype)
    return cfg, from_state_dict(hf_layout(cfg), read_state_dict(path), progress=progress)


def save_hf(
    cfg: ModelConfig, params: dict, path: Path | str, *, drop_recurrence: bool = False, progress: bool = False
) -> None:
    """Write a folder transformers' LlamaForCausalLM loads unchanged.

    A T²MLR model has no HF equivalent; `drop_recurrence=True` exports its backbone (the mixer is
    dropped, so the result computes the model at γ=0). Use `save_t2mlr_torch` to keep the recurrence.
    """
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
    state = to_state_dict(layout, backbone, progress=progress)
    path = Path(path)
    write_state_dict(path, state)
    write_json(path / "config.json", hf_config_from_model(layout.cfg))
