"""Checkpoint interop: every registered checkpoint format (t2mlr_jax.formats.registry: HF Llama folders, GGUF,
nanochat checkpoints, and the systems' release layouts: the authors' PyTorch T²MLR folder, the LRT
release's interleaved GPT, PonderLM-2's release) and our orbax checkpoints, read through one entry point.

    # a .gguf file, or an HF / t2mlr-torch / orbax folder
    cfg, params = load_pretrained("SmolLM2-135M-Instruct.Q4_1.gguf")
    cfg, params = retrofit(cfg, params, RecurrenceConfig(l_start=4, l_end=25), jax.random.key(0))
    save_t2mlr_torch(cfg, params, "out/", tokenizer="SmolLM2-135M-Instruct.Q4_1.gguf")  # the authors' layout
    save_hf(cfg, params, "hf/", drop_recurrence=True)                    # the backbone, for transformers

Names are imported lazily, from where they live (this package, t2mlr_jax.formats, a system's package), so
that the PyTorch reference (t2mlr_jax.architectures.t2mlr.torch_reference) works without JAX installed.
"""

import importlib

_EXPORTS = {
    "load_pretrained": "t2mlr_jax.interop.pretrained",
    "pretrained_config": "t2mlr_jax.interop.pretrained",
    "mismatches": "t2mlr_jax.interop.pretrained",
    "retrofit": "t2mlr_jax.architectures.t2mlr",
    "load_hf": "t2mlr_jax.formats.hf",
    "save_hf": "t2mlr_jax.formats.hf",
    "load_t2mlr_torch": "t2mlr_jax.architectures.t2mlr",
    "save_t2mlr_torch": "t2mlr_jax.architectures.t2mlr",
    "load_nanochat": "t2mlr_jax.formats.nanochat",
    "save_nanochat": "t2mlr_jax.formats.nanochat",
    "load_gguf": "t2mlr_jax.formats.gguf",
    "open_gguf": "t2mlr_jax.formats.gguf",
    "gguf_metadata": "t2mlr_jax.formats.gguf",
    "save_params": "t2mlr_jax.interop.orbax_folder",
    "load_params": "t2mlr_jax.interop.orbax_folder",
    "T2MLRReference": "t2mlr_jax.architectures.t2mlr",
    "read_tokenizer": "t2mlr_jax.formats.tokenizer_files",
    "write_model_card": "t2mlr_jax.interop.model_card",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
