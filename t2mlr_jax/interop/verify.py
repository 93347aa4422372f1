"""Run a converted model on both sides (ours in JAX, the PyTorch one in transformers or a torch
reference) on the same token sequences and report the largest logit difference."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from jaxtyping import Float, Int

from t2mlr_jax.architectures.t2mlr import exact_forward
from t2mlr_jax.interop.files import read_json
from t2mlr_jax.model import backbone
from t2mlr_jax.model.config import ModelConfig

TORCH_FORMATS = ("hf", "gguf", "t2mlr-torch", "nanochat", "ponderlm2")


def sample_tokens(vocab_size: int, num_sequences: int, seq_len: int, seed: int = 0) -> Int[np.ndarray, "B T"]:
    return np.random.default_rng(seed).integers(0, vocab_size, (num_sequences, seq_len), dtype=np.int32)


def jax_logits(
    cfg: ModelConfig, params: dict, tokens: Int[np.ndarray, "B T"], ponderlm2: dict | None = None
) -> Float[np.ndarray, "B T V"]:
    """Our logits: exact recurrence for a T²MLR model, arch ponderlm2's evaluation with the section
    `ponderlm2` when given, the plain forward otherwise."""
    if ponderlm2 is not None:
        from t2mlr_jax.interop.ponderlm2_forward import evaluation_logits

        return evaluation_logits(cfg, params, ponderlm2, tokens)
    if cfg.recurrence is None:
        return np.asarray(backbone.forward(cfg, params, jnp.asarray(tokens)))
    return np.asarray(exact_forward(cfg, params, jnp.asarray(tokens)).logits)


def torch_model(fmt: str, path: Path | str) -> Callable[[Int[np.ndarray, "B T"]], Float[np.ndarray, "B T V"]]:
    """The PyTorch side as tokens -> logits: transformers for HF folders and GGUF files, the references for
    T²MLR and nanochat; loaded once for every token set compared."""
    import torch

    path = Path(path)
    if fmt == "t2mlr-torch":
        from t2mlr_jax.interop.torch_reference import T2MLRReference

        model = T2MLRReference.from_pretrained(path)
    elif fmt == "nanochat":
        from t2mlr_jax.interop.nanochat_torch import NanochatReference

        model = NanochatReference.from_checkpoint(path)
    elif fmt == "ponderlm2":
        from t2mlr_jax.interop.ponderlm2_torch import PonderLM2Reference

        model = PonderLM2Reference.from_pretrained(path)
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

    def logits(tokens):
        with torch.no_grad():
            out = model(torch.as_tensor(tokens, dtype=torch.long))
        return (out if isinstance(out, torch.Tensor) else out.logits).float().numpy()

    return logits


def text_windows(ids: Int[np.ndarray, " n"], num_sequences: int, seq_len: int) -> Int[np.ndarray, "B T"]:
    """The first num_sequences * seq_len ids of a text, one window of seq_len per row."""
    needed = num_sequences * seq_len
    if len(ids) < needed:
        raise ValueError(
            f"the text has {len(ids)} tokens, fewer than {num_sequences} windows x {seq_len} = {needed}"
        )
    return np.asarray(ids[:needed], np.int32).reshape(num_sequences, seq_len)


def compare(
    cfg: ModelConfig,
    params: dict,
    torch_side: Callable,
    tokens: Int[np.ndarray, "B T"],
    tolerance: float,
    ponderlm2: dict | None = None,
) -> dict:
    """The largest |logit difference| on `tokens`; it passes when that difference, relative to the largest
    |logit|, is within `tolerance`: random tokens drive real models to logits of ~30, where fp32 summation
    order alone moves them by ~5e-4."""
    if tokens.max() >= cfg.vocab_size:
        raise ValueError(f"token id {tokens.max()} is outside the model's vocabulary ({cfg.vocab_size})")
    if tokens.shape[1] > cfg.max_seq_len:
        raise ValueError(
            f"sequences of {tokens.shape[1]} tokens are longer than the model's context ({cfg.max_seq_len}): "
            "lower --seq-len"
        )
    reference = torch_side(tokens)
    diff = float(np.abs(jax_logits(cfg, params, tokens, ponderlm2) - reference).max())
    relative = diff / max(float(np.abs(reference).max()), 1e-30)
    return {
        "num_sequences": tokens.shape[0],
        "seq_len": tokens.shape[1],
        "max_abs_logit_diff": diff,
        "max_rel_logit_diff": relative,
        "tolerance": tolerance,
        "passed": relative <= tolerance,
    }


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
    text_tokens: Int[np.ndarray, "B T"] | None = None,
) -> dict:
    """The JSON-able report comparing our model with the PyTorch one at `path` (see `compare`) on random
    tokens, and under "text" on `text_tokens` (real text, e.g. `text_windows`) when given. The top-level
    "passed" is the random tokens'; `report_sections` lists both."""
    torch_side = torch_model(fmt, path)
    ponderlm2 = None
    if fmt == "ponderlm2":  # its evaluation forward, with the settings its folder records
        from t2mlr_jax.interop.ponderlm2_release import ponderlm2_settings

        ponderlm2 = ponderlm2_settings(read_json(Path(path) / "config.json"))
    mode = "ponderlm2" if ponderlm2 else "exact" if cfg.recurrence else "plain"
    report = {
        "torch_format": fmt,
        "torch_path": str(path),
        "mode": mode,
        "seed": seed,
        **compare(
            cfg,
            params,
            torch_side,
            sample_tokens(cfg.vocab_size, num_sequences, seq_len, seed),
            tolerance,
            ponderlm2,
        ),
    }
    if text_tokens is not None:
        report["text"] = compare(cfg, params, torch_side, text_tokens, tolerance, ponderlm2)
    return report


def report_sections(report: dict) -> list[tuple[str, dict]]:
    """(label, section) for the random tokens and, if compared, the text."""
    sections = [(f"random tokens (seed {report['seed']})", report)]
    if "text" in report:
        sections.append((f"text {report['text'].get('file', '')}".strip(), report["text"]))
    return sections
