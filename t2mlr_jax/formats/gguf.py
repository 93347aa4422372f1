"""GGUF files (llama.cpp): model config, dequantized weights and metadata, read from one `GGUFReader`.

Weights come out under HF names as float32 (`gguf.quants.dequantize`), with the Q and K rows
un-permuted: llama.cpp's converter interleaves each head's two rotary halves, HF keeps them apart.
`gguf_metadata` also gives the tokenizer's `tokenizer.ggml.*` fields (t2mlr_jax.data builds the tokenizer).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from t2mlr_jax.formats.files import one_line
from t2mlr_jax.formats.hf import transformers_model
from t2mlr_jax.formats.registry import FIRST, CheckpointFormat, naming, register_format
from t2mlr_jax.formats.tables import from_state_dict, hf_layout
from t2mlr_jax.model.config import ModelConfig

# GGUF tensor name -> HF Llama key; `{i}` is the block index.
GGUF_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
}
_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")


def open_gguf(path: Path | str):
    """The parsed file (a `gguf.GGUFReader`; parsing the metadata takes seconds, so reuse it). The reader
    maps every tensor as it parses, so a file cut short fails here, before any weight is read. The gguf
    package is in the [torch] extra, so a base install meets a one-line error here, not a traceback."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise ValueError(f"{path}: reading GGUF needs the gguf package: pip install -e '.[torch]'") from None

    try:
        return GGUFReader(str(path))
    except OSError:
        raise
    except Exception as e:  # noqa: BLE001 -- gguf meets bad bytes with whatever numpy or struct raised
        raise ValueError(f"{path}: not a readable GGUF file ({type(e).__name__}: {one_line(e)})") from None


def gguf_metadata(reader) -> dict[str, Any]:
    """Every metadata field as a plain Python value (strings, numbers, lists)."""
    return {name: field.contents() for name, field in reader.fields.items()}


def gguf_model_config(reader, *, param_dtype: str = "float32") -> ModelConfig:
    """Our config from the `llama.*` metadata; the head is tied when the file has no output.weight."""
    meta = gguf_metadata(reader)
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"GGUF architecture {arch!r}: only 'llama' is supported")
    if meta.get("llama.rope.scaling.type", "none") != "none":
        raise ValueError(
            f"GGUF rope scaling {meta['llama.rope.scaling.type']!r} is not implemented by the model"
        )

    def get(key, default=None):
        value = meta.get(f"llama.{key}", default)
        if value is None:
            raise ValueError(f"GGUF metadata lacks llama.{key}")
        return value

    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
    vocab = meta.get("llama.vocab_size") or len(meta["tokenizer.ggml.tokens"])
    return ModelConfig(
        vocab_size=int(vocab),
        hidden_size=hidden,
        num_layers=int(get("block_count")),
        num_heads=heads,
        num_kv_heads=int(get("attention.head_count_kv", heads)),
        head_dim=int(get("attention.key_length", hidden // heads)),
        mlp_dim=int(get("feed_forward_length")),
        rope_theta=float(get("rope.freq_base", 10_000.0)),
        norm_eps=float(get("attention.layer_norm_rms_epsilon")),
        tie_embeddings=all(t.name != "output.weight" for t in reader.tensors),
        max_seq_len=int(get("context_length", 8192)),
        param_dtype=param_dtype,
    )


def _unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's per-head interleave of the rotary halves (rows h*E + 2j + k -> h*E + k*E/2 + j)."""
    out, d_in = weight.shape
    return weight.reshape(heads, out // heads // 2, 2, d_in).swapaxes(1, 2).reshape(out, d_in)


def _hf_name(name: str) -> str | None:
    match = _BLOCK.match(name)
    if match:
        template = GGUF_NAMES.get(f"blk.{{i}}.{match.group(2)}")
        return template and template.format(i=match.group(1))
    return GGUF_NAMES.get(name)


def gguf_state_dict(reader, cfg: ModelConfig, *, progress: bool = False) -> dict[str, np.ndarray]:
    """All tensors dequantized to float32, under HF Llama names, Q/K rows un-permuted."""
    from gguf.quants import dequantize

    state, unknown = {}, []
    for tensor in tqdm(reader.tensors, desc="dequantize GGUF", disable=not progress):
        key = _hf_name(tensor.name)
        if key is None:
            unknown.append(tensor.name)
            continue
        try:
            weight = dequantize(tensor.data, tensor.tensor_type)
        except NotImplementedError as e:
            raise ValueError(f"{tensor.name}: cannot dequantize GGML type {tensor.tensor_type.name}") from e
        weight = np.asarray(weight, np.float32).reshape(tuple(int(n) for n in tensor.shape[::-1]))
        if key.endswith("q_proj.weight"):
            weight = _unpermute(weight, cfg.num_heads)
        elif key.endswith("k_proj.weight"):
            weight = _unpermute(weight, cfg.num_kv_heads)
        state[key] = weight
    if unknown:
        raise ValueError(f"GGUF tensors with no Llama equivalent: {unknown}")
    return state


def load_gguf(
    path_or_reader, *, param_dtype: str = "float32", progress: bool = False
) -> tuple[ModelConfig, dict]:
    """(ModelConfig, params) from a GGUF file or an already opened reader."""
    reader = path_or_reader if hasattr(path_or_reader, "tensors") else open_gguf(path_or_reader)
    cfg = gguf_model_config(reader, param_dtype=param_dtype)
    return cfg, from_state_dict(
        hf_layout(cfg), gguf_state_dict(reader, cfg, progress=progress), progress=progress
    )


def gguf_config(path: Path | str, *, param_dtype: str = "float32") -> ModelConfig:
    """The file's ModelConfig; opening it maps every tensor, so a file cut short is refused here."""
    reader = open_gguf(path)
    with naming(path):
        return gguf_model_config(reader, param_dtype=param_dtype)


register_format(
    CheckpointFormat(
        "gguf",
        recognises=lambda path: path.is_file() and path.suffix == ".gguf",
        read_config=gguf_config,
        load=load_gguf,
        torch_model=lambda path: transformers_model(
            pretrained_model_name_or_path=path.parent, gguf_file=path.name
        ),
        priority=FIRST,
        described="a .gguf file",
    )
)
