"""What the trainer needs from a task's data, and the checks that run before anything is compiled.

A `DataSource` is built from `config.data` by `build_data_source` (t2mlr_jax.train.build_data); tests build
small ones directly. Iterators follow grain's DatasetIterator protocol (`next`, `get_state`, `set_state`),
which is what makes resumption exact.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, Protocol


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
