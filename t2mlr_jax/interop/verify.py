"""Run a converted model on both sides (ours in JAX, the PyTorch one in transformers or a torch
reference: its format's registered `torch_model`) on the same token sequences and report the largest
logit difference."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from jaxtyping import Float, Int

from t2mlr_jax.architectures.t2mlr import exact_forward
from t2mlr_jax.interop.pretrained import formats
from t2mlr_jax.model import backbone
from t2mlr_jax.model.config import ModelConfig


def sample_tokens(vocab_size: int, num_sequences: int, seq_len: int, seed: int = 0) -> Int[np.ndarray, "B T"]:
    return np.random.default_rng(seed).integers(0, vocab_size, (num_sequences, seq_len), dtype=np.int32)


def jax_logits(
    cfg: ModelConfig, params: dict, tokens: Int[np.ndarray, "B T"], evaluation: Callable | None = None
) -> Float[np.ndarray, "B T V"]:
    """Our logits: the format's `evaluation` when given (PonderLM-2's), exact recurrence for a T²MLR
    model, the plain forward otherwise."""
    if evaluation is not None:
        return np.asarray(evaluation(cfg, params, tokens))
    if cfg.recurrence is None:
        return np.asarray(backbone.forward(cfg, params, jnp.asarray(tokens)))
    return np.asarray(exact_forward(cfg, params, jnp.asarray(tokens)).logits)


def torch_model(fmt: str, path: Path | str) -> Callable[[Int[np.ndarray, "B T"]], Float[np.ndarray, "B T V"]]:
    """The PyTorch side as tokens -> logits, the format's registered `torch_model` (transformers for HF
    folders and GGUF files, the references for the releases); loaded once for every token set compared."""
    import torch

    torch_formats = [name for name in formats().names() if formats().get(name).torch_model]
    if fmt not in torch_formats:
        raise ValueError(f"format must be one of {tuple(torch_formats)}, got {fmt!r}")
    model = formats().get(fmt).torch_model(Path(path))

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
    evaluation: Callable | None = None,
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
    diff = float(np.abs(jax_logits(cfg, params, tokens, evaluation) - reference).max())
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
    # the format's own evaluation forward where it has one (PonderLM-2's, with its folder's settings)
    evaluate = formats().get(fmt).evaluation
    evaluation = evaluate(Path(path)) if evaluate else None
    mode = fmt if evaluation else "exact" if cfg.recurrence else "plain"
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
            evaluation,
        ),
    }
    if text_tokens is not None:
        report["text"] = compare(cfg, params, torch_side, text_tokens, tolerance, evaluation)
    return report


def report_sections(report: dict) -> list[tuple[str, dict]]:
    """(label, section) for the random tokens and, if compared, the text."""
    sections = [(f"random tokens (seed {report['seed']})", report)]
    if "text" in report:
        sections.append((f"text {report['text'].get('file', '')}".strip(), report["text"]))
    return sections
