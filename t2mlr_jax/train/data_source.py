"""What the trainer needs from a task's data, and the checks that run before anything is compiled.

A `DataSource` is built from `config.data` by `build_data_source` (t2mlr_jax.train.build_data); tests build
small ones directly. Iterators follow grain's DatasetIterator protocol (`next`, `get_state`, `set_state`),
which is what makes resumption exact.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, Protocol

from t2mlr_jax.config.sections import Eval
from t2mlr_jax.model.generate import check_sampling


class StatefulIterator(Protocol):
    def __next__(self) -> dict: ...

    def get_state(self) -> Any: ...

    def set_state(self, state: Any) -> None: ...


class DataSource(NamedTuple):
    vocab_size: int  # the tokenizer's; must fit the model's vocabulary
    seq_len: int  # the longest row a batch can hold; must fit the model's max_seq_len
    train_iterator: Callable[[], StatefulIterator]  # a fresh iterator of training batches
    eval_batches: Callable[
        [], Iterable[dict]
    ]  # a finite pass over the whole eval set, the same on every host
    pad_id: int = 0
    eos_id: int | None = None
    # Generation eval (SFT tasks): examples with int `prompt` (+ optional `prompt_control_flow`, `length`);
    # `decode(ids) -> str`; `score(text, example) -> bool`.
    generation_examples: Callable[[], Iterable[dict]] | None = None
    decode: Callable[[Any], str] | None = None
    score: Callable[[str, dict], bool] | None = None
    train_examples: int | None = None  # the training set's size where it is counted (train.epochs)
    target_bytes: bool = False  # training batches carry `target_bytes` (bits per byte)


def check_fits(data: DataSource, *, vocab_size: int | None, max_seq_len: int | None) -> None:
    """One clear error if the data cannot be fed to the model (before compiling anything)."""
    if vocab_size is not None and data.vocab_size > vocab_size:
        raise ValueError(
            f"the tokenizer has {data.vocab_size} tokens but the model's vocabulary is {vocab_size}: "
            "tokenizer/vocab mismatch (set model.vocab_size or use the task's tokenizer)"
        )
    if max_seq_len is not None and data.seq_len > max_seq_len:
        raise ValueError(
            f"data sequences are {data.seq_len} tokens, longer than the model's context "
            f"(model.max_seq_len = {max_seq_len})"
        )


def check_generation(data: DataSource, eval_config: Eval, *, max_seq_len: int | None) -> None:
    """One clear error for generation settings that cannot run: eval.max_new_tokens < 1, bad sampling
    settings (eval.temperature / top_k / top_p), and with eval.generate a task without prompts or a prompt
    that leaves no room for the new tokens. Checked when the run is built, not when the first evaluation
    (perhaps hours into training) reaches it."""
    if eval_config.max_new_tokens < 1:
        raise ValueError(f"eval.max_new_tokens must be >= 1, got {eval_config.max_new_tokens}")
    e = eval_config
    try:
        check_sampling(e.max_new_tokens, e.temperature, e.top_k, e.top_p)
    except ValueError as error:
        raise ValueError(f"eval.{error}") from None
    if not eval_config.generate:
        return
    if data.generation_examples is None:
        raise ValueError("eval.generate is on but this task has no prompts to generate from: turn it off")
    # Bounded: file and generated tasks yield eval.num_examples prompts, text tasks a few eval batches.
    check_prompts_fit(data.generation_examples(), eval_config.max_new_tokens, max_seq_len)


def check_prompts_fit(examples: Iterable[dict], max_new_tokens: int, max_seq_len: int | None) -> None:
    """Each example's `prompt` plus `max_new_tokens` within the model's context: past it the positions are
    ones the model never had, and its continuation would be silently meaningless."""
    if max_seq_len is None:
        return
    for i, example in enumerate(examples):
        n = len(example["prompt"])
        if n + max_new_tokens > max_seq_len:
            raise ValueError(
                f"generation example {i} has a {n}-token prompt: with max_new_tokens {max_new_tokens} it "
                f"needs {n + max_new_tokens} positions, more than the model's context of {max_seq_len}: "
                "shorten or drop that prompt, or lower eval.max_new_tokens"
            )
