"""Checkpoint interop: HF Llama folders, GGUF, the authors' PyTorch T²MLR layout, nanochat checkpoints
(karpathy/nanochat, the LRT release) and our orbax checkpoints.

    # a .gguf file, or an HF / t2mlr-torch / orbax folder
    cfg, params = load_pretrained("SmolLM2-135M-Instruct.Q4_1.gguf")
    cfg, params = retrofit(cfg, params, RecurrenceConfig(l_start=4, l_end=25), jax.random.key(0))
    save_t2mlr_torch(cfg, params, "out/", tokenizer="SmolLM2-135M-Instruct.Q4_1.gguf")  # the authors' layout
    save_hf(cfg, params, "hf/", drop_recurrence=True)                    # the backbone, for transformers

Names are imported lazily so that `t2mlr_jax.interop.torch_reference` works without JAX installed.
"""

import importlib

_EXPORTS = {
    "load_pretrained": "pretrained",
    "pretrained_config": "pretrained",
    "retrofit": "pretrained",
    "mismatches": "pretrained",
    "load_hf": "hf",
    "save_hf": "hf",
    "load_t2mlr_torch": "t2mlr_torch",
    "save_t2mlr_torch": "t2mlr_torch",
    "load_nanochat": "nanochat",
    "save_nanochat": "nanochat",
    "load_gguf": "gguf",
    "open_gguf": "gguf",
    "gguf_metadata": "gguf",
    "save_params": "orbax_folder",
    "load_params": "orbax_folder",
    "T2MLRReference": "torch_reference",
    "read_tokenizer": "tokenizer_files",
    "write_model_card": "model_card",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
