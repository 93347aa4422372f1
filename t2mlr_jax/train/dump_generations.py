"""`--mode=generate`: greedy outputs of a trained model for the first eval examples, as JSONL.

Tasks with prompts (SFT) decode continuations with the architecture's generate; position-aligned tasks
(S5) record the per-position argmax of the eval forward against the targets on the scored positions, the
first eval.max_new_tokens of them (`aligned_record`).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
from jaxtyping import Bool, Int

from t2mlr_jax.parallel.multihost import is_lead_host, to_host
from t2mlr_jax.train.eval import evaluate_generation, make_eval_step, sampling_settings, score_mask
from t2mlr_jax.train.train_step import model_inputs

GENERATIONS = "generations.jsonl"


def _position_aligned(run, params, model_state, count: int, max_new_tokens: int) -> list[dict]:
    step, decode, records = make_eval_step(run.arch), run.data.decode, []
    for batch in run.data.eval_batches():
        predictions = to_host(step(params, model_state, model_inputs(batch)))["predictions"]
        mask = score_mask(batch, run.config.eval.score)
        for row in range(len(predictions)):
            if len(records) == count or not mask[row].any():
                continue
            tokens, targets, seen = batch["tokens"][row], batch["targets"][row], batch["segment_ids"][row] > 0
            records.append(
                aligned_record(tokens, targets, predictions[row], mask[row], seen, decode, max_new_tokens)
            )
        if len(records) == count:
            break
    return records


def aligned_record(
    tokens: Int[np.ndarray, " T"],
    targets: Int[np.ndarray, " T"],
    predictions: Int[np.ndarray, " T"],
    scored: Bool[np.ndarray, " T"],
    seen: Bool[np.ndarray, " T"],
    decode: Callable,
    max_new_tokens: int,
) -> dict:
    """One row of a position-aligned task: its answer is every scored position, all predicted by one forward
    (inputs never depend on outputs), so a generation of max_new_tokens is the answer's first
    max_new_tokens tokens; one cut short is not correct, as a generation stopped before its answer is not."""
    answer, target = predictions[scored], targets[scored]
    return {
        "input": decode(tokens[seen]),
        "prediction": decode(answer[:max_new_tokens]),
        "target": decode(target),
        "correct": len(target) <= max_new_tokens and bool((answer == target).all()),
    }


def write_generations(run, params: dict, model_state, count: int) -> Path:
    if run.data.generation_examples is None:
        records = _position_aligned(run, params, model_state, count, run.config.eval.max_new_tokens)
    else:
        examples = list(itertools.islice(run.data.generation_examples(), count))
        cfg = run.config.eval
        _, scored = evaluate_generation(
            run.arch,
            params,
            model_state,
            examples,
            decode=run.data.decode,
            score=run.data.score,
            max_new_tokens=cfg.max_new_tokens,
            eos_id=run.data.eos_id,
            pad_id=run.data.pad_id,
            batch_size=min(cfg.batch_size, count),
            **sampling_settings(run.config),
        )
        records = [{"prompt": run.data.decode(e["prompt"]), **r} for e, r in zip(examples, scored)]
    path = run.workdir / GENERATIONS
    if is_lead_host():
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path
