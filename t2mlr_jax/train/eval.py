"""Evaluation: teacher-forced loss / perplexity / bits per byte / per-token accuracy, sequence exact match
per length bin, and generation exact match (greedy, or sampled: eval.temperature / top_k / top_p).

The loss uses the architecture's eval forward (exact recurrence for T²MLR unless eval.mode = jacobi).
For position-aligned tasks (S5-retrieval) the per-position argmax of that one forward *is* the greedy
prediction (inputs never depend on outputs), so "exact match" there is "every supervised position
right"; tasks whose answers are generated use `evaluate_generation`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from t2mlr_jax.architectures import Architecture
from t2mlr_jax.architectures.contract import row_stats
from t2mlr_jax.config.sections import BPB_MASKINGS, Experiment, one_of
from t2mlr_jax.data.batch import RECURRENT
from t2mlr_jax.data.metrics import LengthBinnedAccuracy, sequence_exact_match
from t2mlr_jax.model.generate import GREEDY, Sampling, check_sampling
from t2mlr_jax.parallel.multihost import to_host
from t2mlr_jax.train.data_source import check_prompts_fit
from t2mlr_jax.train.train_step import model_inputs

BIN_KEY = "length"  # optional per-row metadata of the batch contract (S5: the number of actions)
SCORES = ("loss_mask", "recurrent")


def make_eval_step(arch: Architecture) -> Callable[[dict, Any, dict], dict]:
    """jit (params, model_state, batch) -> per-row loss_sum / tokens (/ bytes with target_bytes) and
    per-position argmax of the eval forward (deterministic: a fixed rng)."""

    @jax.jit
    def step(params, model_state, batch):
        out = arch.apply(params, batch, training=False, rng=jax.random.PRNGKey(0), model_state=model_state)
        return {**row_stats(out.logits, batch), "predictions": jnp.argmax(out.logits, axis=-1)}

    return step


def score_mask(batch: dict, score: str) -> np.ndarray:
    """Positions that count for accuracy: the loss mask, or only recurrent positions that are also in it
    (S5: the answers, not the dictionary the labels merely copy)."""
    if score not in SCORES:
        raise ValueError(f"eval.score must be one of {SCORES}, got {score!r}")
    mask = batch["loss_mask"] > 0
    return mask & (batch["control_flow"] == RECURRENT) if score == "recurrent" else mask


def evaluate(
    eval_step: Callable[[dict, Any, dict], dict],
    params: dict,
    model_state: Any,
    batches: Iterable[dict],
    score: str = "loss_mask",
    bpb_masking: str = "loss_mask",
) -> dict:
    """Over `batches`: loss and perplexity (all supervised tokens), bits per byte ("bpb": the summed loss
    in bits over the targets' UTF-8 bytes, the loss of zero-byte targets left out when `bpb_masking` is
    "nanochat": eval.bpb_masking) when batches carry `target_bytes`, token accuracy and sequence exact
    match (on `score` positions), and both per length bin when batches carry `length`."""
    one_of("eval.bpb_masking", bpb_masking, BPB_MASKINGS)
    bpb_key = "byte_loss_sum" if bpb_masking == "nanochat" else "loss_sum"
    loss_sum = tokens = correct = scored = exact = examples = target_bytes = bpb_nats = 0.0
    bins = LengthBinnedAccuracy()
    for batch in batches:
        rows = to_host(eval_step(params, model_state, model_inputs(batch)))
        mask = score_mask(batch, score)
        right = (rows["predictions"] == batch["targets"]) & mask
        loss_sum += float(rows["loss_sum"].sum())
        tokens += float(rows["tokens"].sum())
        if "bytes" in rows:
            target_bytes += float(rows["bytes"].sum())
            bpb_nats += float(rows[bpb_key].sum())
        correct += float(right.sum())
        scored += float(mask.sum())
        exact += float(sequence_exact_match(rows["predictions"], batch["targets"], mask).sum())
        examples += float(mask.any(axis=1).sum())
        if BIN_KEY in batch:
            bins.update(rows["predictions"], batch, mask=mask)
    if not tokens or not scored:
        raise ValueError("evaluation saw no supervised tokens: is the eval set empty?")
    loss = loss_sum / tokens
    return {
        "loss": loss,
        "perplexity": float(np.exp(min(loss, 50.0))),
        **({"bpb": float(bpb_nats / (np.log(2.0) * target_bytes))} if target_bytes else {}),
        "token_accuracy": correct / scored,
        "exact_match": exact / examples,
        "examples": int(examples),
        "by_length": bins.result(),
    }


def sampling_settings(config: Experiment) -> dict:
    """`evaluate_generation`'s sampling and seed from an experiment config: eval.temperature (0 = greedy),
    eval.top_k, eval.top_p, and the config's seed."""
    e = config.eval
    return {
        "sampling": Sampling(float(e.temperature), int(e.top_k), float(e.top_p)),
        "seed": int(config.seed),
    }


def left_pad(
    prompts: list[np.ndarray], pad_id: int, width: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Prompts as one left-padded [B, P] array and its mask (1 = real)."""
    width = width or max(len(p) for p in prompts)
    tokens = np.full((len(prompts), width), pad_id, np.int32)
    mask = np.zeros((len(prompts), width), np.int32)
    for i, p in enumerate(prompts):
        tokens[i, width - len(p) :] = p
        mask[i, width - len(p) :] = 1
    return tokens, mask


def evaluate_generation(
    arch: Architecture,
    params: dict,
    model_state: Any,
    examples: Iterable[dict],
    *,
    decode: Callable,
    score: Callable[[str, dict], bool],
    max_new_tokens: int,
    eos_id: int | None,
    pad_id: int,
    batch_size: int,
    sampling: Sampling = GREEDY,
    seed: int = 0,
) -> tuple[dict, list[dict]]:
    """Generation from each example's `prompt` (int ids; optional `prompt_control_flow`), greedy or by
    `sampling` (one sample per prompt, the batch starting at example i drawing from
    fold_in(PRNGKey(seed), i): the same draws on every run); `score(text, example)` says whether the decoded
    continuation is right. Returns the exact match (overall and per `length` bin when examples carry one)
    and one record per example. A prompt that leaves no room in the model's context for `max_new_tokens`,
    or bad sampling settings, are an error before anything compiles."""
    sampled = sampling.temperature > 0  # greedy calls pass no sampling: a generate need not know it
    generate = jax.jit(
        arch.generate, static_argnums=(5, 6, 7), static_argnames=["sampling"] if sampled else []
    )
    records, examples = [], list(examples)
    if not examples:
        raise ValueError("generation eval got no examples")
    check_prompts_fit(examples, max_new_tokens, arch.max_seq_len)
    check_sampling(max_new_tokens, *sampling)
    width = max(len(e["prompt"]) for e in examples)  # one compiled shape for every batch
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        chunk = chunk + [chunk[-1]] * (batch_size - len(chunk))
        tokens, mask = left_pad([e["prompt"] for e in chunk], pad_id, width)
        control_flow = None
        if "prompt_control_flow" in chunk[0]:
            control_flow = left_pad([e["prompt_control_flow"] for e in chunk], 0, width)[0]
        key = jax.random.fold_in(jax.random.PRNGKey(seed), start)
        draw = {"sampling": sampling, "key": key} if sampled else {}
        out = to_host(
            generate(params, model_state, tokens, mask, control_flow, max_new_tokens, eos_id, pad_id, **draw)
        )
        for i, e in enumerate(chunk[: len(examples) - start]):
            ids = out.tokens[i, : out.lengths[i]]
            ids = ids[:-1] if eos_id is not None and len(ids) and ids[-1] == eos_id else ids
            text = decode(ids)
            records.append(
                {
                    "prediction": text,
                    "correct": bool(score(text, e)),
                    **({BIN_KEY: int(e[BIN_KEY])} if BIN_KEY in e else {}),
                }
            )
    bins = defaultdict(list)
    for r in records:
        if BIN_KEY in r:
            bins[r[BIN_KEY]].append(r["correct"])
    return (
        {
            "generation_exact_match": float(np.mean([r["correct"] for r in records])),
            "examples": len(records),
            "generation_by_length": {
                n: {"exact_match": float(np.mean(v)), "examples": len(v)} for n, v in sorted(bins.items())
            },
        },
        records,
    )
