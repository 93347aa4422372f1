"""Prompt -> response examples (SFT and the generated reasoning tasks), tokenized the release's way.

The prompt and the response are tokenized separately and concatenated; the response ends with EOS.
Without a chat template the prompt gets a "\n\n" separator (unless it already ends with one); with it,
the prompt is SmolLM2's one-turn chat prompt. Control flow is 1 on the prompt and 2 on the response
(`all_recurrent`: 2 everywhere but the first token); the loss counts where the *target* token belongs to
the response (`prompt_loss`: everywhere), which is the release's control-flow-derived labels shifted to
our position-aligned targets.
"""

from __future__ import annotations

import numpy as np
from jaxtyping import Int

from t2mlr_jax.data.batch import PROMPT, RECURRENT
from t2mlr_jax.data.tokenizer import TextTokenizer

ANSWER_MARKER = "###"


def format_prompt(prompt: str, tokenizer: TextTokenizer, *, chat: bool) -> str:
    if chat:
        return tokenizer.chat_prompt(prompt)
    return prompt if prompt.endswith("\n\n") else prompt + "\n\n"


def encode_prompt(prompt: str, tokenizer: TextTokenizer, *, chat: bool = False) -> Int[np.ndarray, " n"]:
    """int32 ids of the prompt as the model sees it before generating (for greedy-generation eval)."""
    return tokenizer.encode(format_prompt(prompt, tokenizer, chat=chat))


def encode_prompt_response(
    prompt: str,
    response: str,
    tokenizer: TextTokenizer,
    *,
    chat: bool = False,
    all_recurrent: bool = False,
    prompt_loss: bool = False,
) -> dict[str, np.ndarray]:
    """One example (see t2mlr_jax.data.batch) with next-token targets."""
    prompt_ids = encode_prompt(prompt, tokenizer, chat=chat)
    response_ids = np.append(tokenizer.encode(response), np.int32(tokenizer.eos_id)).astype(np.int32)
    tokens = np.concatenate([prompt_ids, response_ids])
    n, p = len(tokens), len(prompt_ids)
    control_flow = np.full(n, RECURRENT, np.int32)
    control_flow[: 1 if all_recurrent else p] = PROMPT
    targets = np.append(tokens[1:], np.int32(0)).astype(np.int32)
    loss_mask = np.zeros(n, np.float32)
    loss_mask[0 if prompt_loss else max(p - 1, 0) : n - 1] = 1.0
    return {"tokens": tokens, "targets": targets, "loss_mask": loss_mask, "control_flow": control_flow}


def steps_answer_response(steps, answer) -> str:
    """The release's steps/answer formatter: reasoning lines, then "### <answer>"."""
    lines = [str(s).strip() for s in ([steps] if isinstance(steps, str) else steps or [])]
    reasoning = "\n".join(line for line in lines if line)
    answer = str(answer).strip()
    if answer and ANSWER_MARKER not in answer:
        answer = f"{ANSWER_MARKER} {answer}"
    return "\n".join(part for part in (reasoning, answer) if part)


def gsm8k_aug_record(row: dict) -> dict:
    """GSM8K-Aug row {question, steps, answer} -> {prompt, response, answer}."""
    _require(row, ("question", "steps", "answer"), "GSM8K-Aug")
    return {
        "prompt": str(row["question"]),
        "response": steps_answer_response(row["steps"], row["answer"]),
        "answer": str(row["answer"]).strip(),
    }


def hotpotqa_record(row: dict) -> dict:
    """HotpotQA CoT row {question, context, steps|cot, answer} -> {prompt, response, answer}.

    `context` is HotpotQA's list of [title, sentences] pairs, its {"title": [...], "sentences": [...]}
    column form, or a list of strings; it becomes "Context:\nDocument 1: ...\nDocument 2: ..."
    (paper, Table 15).
    """
    _require(row, ("question", "context", "answer"), "HotpotQA")
    steps = row.get("steps", row.get("cot"))
    if steps is None:
        raise ValueError("HotpotQA row needs a 'steps' or 'cot' field with the chain of thought")
    context = row["context"]
    if isinstance(context, dict):
        context = list(zip(context["title"], context["sentences"]))
    documents = [d if isinstance(d, str) else " ".join(s.strip() for s in d[1]) for d in context]
    prompt = f"{str(row['question']).strip()}\nContext:\n" + "\n".join(
        f"Document {i}: {doc.strip()}" for i, doc in enumerate(documents, 1)
    )
    return {
        "prompt": prompt,
        "response": steps_answer_response(steps, row["answer"]),
        "answer": str(row["answer"]).strip(),
    }


def _require(row: dict, keys: tuple[str, ...], what: str) -> None:
    missing = [k for k in keys if k not in row]
    if missing:
        raise ValueError(f"{what} row is missing fields {missing} (has {sorted(row)})")
