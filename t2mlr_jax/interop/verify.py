"""Run a converted model on both sides (ours in JAX, the PyTorch one in transformers or the torch
reference) on the same token sequences and report the largest logit difference."""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import numpy as np
from jaxtyping import Float, Int

from t2mlr_jax.model import backbone, recurrence
from t2mlr_jax.model.config import ModelConfig

TORCH_FORMATS = ("hf", "gguf", "t2mlr-torch")


def sample_tokens(vocab_size: int, num_sequences: int, seq_len: int, seed: int = 0) -> Int[np.ndarray, "B T"]:
    return np.random.default_rng(seed).integers(0, vocab_size, (num_sequences, seq_len), dtype=np.int32)


def jax_logits(cfg: ModelConfig, params: dict, tokens: Int[np.ndarray, "B T"]) -> Float[np.ndarray, "B T V"]:
    """Our logits: exact recurrence for a T²MLR model, the plain forward otherwise."""
    if cfg.recurrence is None:
        return np.asarray(backbone.forward(cfg, params, jnp.asarray(tokens)))
    return np.asarray(recurrence.exact_forward(cfg, params, jnp.asarray(tokens)).logits)


def torch_logits(fmt: str, path: Path | str, tokens: Int[np.ndarray, "B T"]) -> Float[np.ndarray, "B T V"]:
    """Logits of the PyTorch side: transformers for HF folders and GGUF files, the reference for T²MLR."""
    import torch

    path = Path(path)
    if fmt == "t2mlr-torch":
        from t2mlr_jax.interop.torch_reference import T2MLRReference

        model = T2MLRReference.from_pretrained(path)
    elif fmt in ("hf", "gguf"):
        from transformers import AutoModelForCausalLM

        where = (
            dict(pretrained_model_name_or_path=path)
            if fmt == "hf"
            else dict(pretrained_model_name_or_path=path.parent, gguf_file=path.name)
        )
        model = AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32).eval()
    else:
        raise ValueError(f"format must be one of {TORCH_FORMATS}, got {fmt!r}")
    with torch.no_grad():
        out = model(torch.as_tensor(tokens, dtype=torch.long))
    return (out if isinstance(out, torch.Tensor) else out.logits).float().numpy()


def verify(
    cfg: ModelConfig,
    params: dict,
    fmt: str,
    path: Path | str,
    *,
    num_sequences: int = 3,
    seq_len: int = 32,
    seed: int = 0,
    tolerance: float = 1e-4,
) -> dict:
    """The JSON-able report: largest |logit difference| between our model and the PyTorch one at `path`.

    It passes when that difference, relative to the largest |logit|, is within `tolerance`: random
    tokens drive real models to logits of ~30, where fp32 summation order alone moves them by ~5e-4.
    """
    tokens = sample_tokens(cfg.vocab_size, num_sequences, seq_len, seed)
    reference = torch_logits(fmt, path, tokens)
    diff = float(np.abs(jax_logits(cfg, params, tokens) - reference).max())
    relative = diff / max(float(np.abs(reference).max()), 1e-30)
    return {
        "torch_format": fmt,
        "torch_path": str(path),
        "mode": "exact" if cfg.recurrence else "plain",
        "num_sequences": num_sequences,
        "seq_len": seq_len,
        "seed": seed,
        "max_abs_logit_diff": diff,
        "max_rel_logit_diff": relative,
        "tolerance": tolerance,
        "passed": relative <= tolerance,
    }
