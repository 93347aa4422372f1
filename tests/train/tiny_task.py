"""A tiny position-aligned state-tracking task for trainer tests: the target at t is the running sum of
the tokens mod `modulus` (a cyclic-group word problem). Batches are a pure function of (seed, index), so
the iterator's state is one integer and resumption is exact."""

from __future__ import annotations

import numpy as np

from t2mlr_jax.train.data_source import DataSource

VOCAB = 16
SEQ_LEN = 16  # the rows of tiny_source, and tests.tiny.tiny_experiment's data.seq_len


def tiny_batch(seed: int, index: int, batch: int, seq_len: int, modulus: int = 3) -> dict:
    rng = np.random.default_rng([seed, index])
    lengths = rng.integers(seq_len // 2, seq_len + 1, size=batch)
    tokens = rng.integers(1, modulus + 1, size=(batch, seq_len)).astype(np.int32)
    real = np.arange(seq_len)[None] < lengths[:, None]
    tokens = np.where(real, tokens, 0).astype(np.int32)
    targets = (np.cumsum(tokens, axis=1) % modulus + 4).astype(np.int32) * real
    return {
        "tokens": tokens,
        "targets": targets.astype(np.int32),
        "loss_mask": real.astype(np.float32),
        "positions": np.where(real, np.arange(seq_len)[None], 0).astype(np.int32),
        "segment_ids": real.astype(np.int32),
        "control_flow": (2 * real).astype(np.int32),
        "length": lengths.astype(np.int32),
    }


class TinyIterator:
    def __init__(self, seed: int, batch: int, seq_len: int):
        self.seed, self.batch, self.seq_len, self.index = seed, batch, seq_len, 0

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        self.index += 1
        return tiny_batch(self.seed, self.index, self.batch, self.seq_len)

    def get_state(self) -> dict:
        return {"index": self.index}

    def set_state(self, state: dict) -> None:
        self.index = int(state["index"])


def tiny_source(batch: int = 8, seq_len: int = SEQ_LEN, eval_batches: int = 2) -> DataSource:
    return DataSource(
        vocab_size=VOCAB,
        seq_len=seq_len,
        train_iterator=lambda: TinyIterator(0, batch, seq_len),
        eval_batches=lambda: [tiny_batch(1, i, batch, seq_len) for i in range(eval_batches)],
    )
