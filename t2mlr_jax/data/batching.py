"""Examples -> fixed-shape batches (the contract in t2mlr_jax.data.batch) with grain: per-host sharding,
shuffling, epochs, padding or packing, worker processes. The iterator of the returned IterDataset is
checkpointable (get_state / set_state)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import grain
import numpy as np

from t2mlr_jax.data.batch import BATCH_DTYPES, EXAMPLE_KEYS, PAD, PROMPT, RECURRENT

Packing = Literal["none", "first_fit", "concat_split", "concat"]
# Threads reading examples ahead (grain's default is 16 threads, 500 examples): their Python holds the GIL,
# and 16 of them starved the training thread's tracing for a minute. Two keep a batch ahead on a CPU host;
# heavier per-example work belongs in worker processes (`worker_count`).
READ_THREADS = 2


def batch_examples(
    examples: grain.MapDataset,
    *,
    batch_size: int,
    seq_len: int,
    packing: Packing = "none",
    seed: int = 0,
    shuffle: bool = True,
    num_epochs: int | None = None,
    shard_options: grain.sharding.ShardOptions | None = None,
    worker_count: int = 0,
    drop_remainder: bool = True,
) -> grain.IterDataset:
    """Shard, shuffle, repeat, pack/pad and batch a MapDataset of examples; batch_size is per host.

    packing "none": one example per row, right-padded; an example longer than seq_len raises.
    "first_fit": whole examples packed into rows (grain FirstFitPack); one longer than seq_len raises.
    "concat_split": examples concatenated and cut every seq_len tokens; a cut document continues as a new
    segment of the next row (positions restart, as the release truncates documents at its context).
    "concat": the release's pretraining layout: the examples' tokens as one stream cut every seq_len
    tokens, each row one segment (positions 0..seq_len-1, attention and the recurrence cross documents,
    every token recurrent, the release's control flow 2), targets the next token of the row (across
    documents), the last position of a row unsupervised (its target is in the next row).
    Without drop_remainder the last batch is completed with empty rows, so every batch is
    [batch_size, seq_len].
    """
    if batch_size < 1 or seq_len < 2:
        raise ValueError(f"need batch_size >= 1 and seq_len >= 2, got {batch_size}, {seq_len}")
    if packing not in ("none", "first_fit", "concat_split", "concat"):
        raise ValueError(f"unknown packing {packing!r}")
    shard = shard_options or grain.sharding.ShardByJaxProcess(drop_remainder=True)
    if shard.drop_remainder:
        examples = examples[: len(examples) // shard.shard_count * shard.shard_count]
    examples = examples[shard.shard_index :: shard.shard_count]
    if len(examples) == 0:
        raise ValueError(f"no examples left for shard {shard.shard_index} of {shard.shard_count}")
    if shuffle:
        examples = examples.shuffle(seed=seed)
    examples = examples.repeat(num_epochs)
    read = grain.ReadOptions(num_threads=READ_THREADS, prefetch_buffer_size=2 * batch_size)

    if packing == "none":
        rows = examples.map(lambda ex: _padded_row(ex, seq_len)).to_iter_dataset(read)
    elif packing == "concat":
        stream = examples.map(lambda ex: {"tokens": ex["tokens"]}).to_iter_dataset(read)
        rows = grain.experimental.ConcatThenSplitIterDataset(stream, length_struct={"tokens": seq_len}).map(
            _stream_row
        )
    else:
        lengths = {k: seq_len for k in EXAMPLE_KEYS}
        if packing == "first_fit":
            examples = examples.map(lambda ex: _check_fits(ex, seq_len))
        stripped = examples.map(lambda ex: {k: ex[k] for k in EXAMPLE_KEYS}).to_iter_dataset(read)
        packed = (
            grain.experimental.FirstFitPackIterDataset(
                stripped, length_struct=lengths, num_packing_bins=batch_size, shuffle_bins=False
            )
            if packing == "first_fit"
            else grain.experimental.ConcatThenSplitIterDataset(stripped, length_struct=lengths)
        )
        rows = packed.map(_packed_row)
    batches = rows.batch(
        batch_size,
        drop_remainder=drop_remainder,
        batch_fn=lambda batch_rows: _stack_rows(batch_rows, batch_size, seq_len),
    )
    if worker_count > 0:
        batches = batches.mp_prefetch(grain.MultiprocessingOptions(num_workers=worker_count))
    return batches


def _check_fits(example: dict, seq_len: int) -> dict:
    if len(example["tokens"]) > seq_len:
        raise ValueError(
            f"an example of {len(example['tokens'])} tokens does not fit seq_len {seq_len}; raise seq_len"
        )
    return example


def _padded_row(example: dict, seq_len: int) -> dict:
    n = len(_check_fits(example, seq_len)["tokens"])
    row = {k: np.zeros(seq_len, BATCH_DTYPES[k]) for k in BATCH_DTYPES}
    for key in EXAMPLE_KEYS:
        row[key][:n] = example[key]
    row["positions"][:n] = np.arange(n)
    row["segment_ids"][:n] = 1
    if "length" in example:
        row["length"] = np.int32(example["length"])
    return row


def _packed_row(packed: dict) -> dict:
    positions, segments = packed["tokens_positions"], packed["tokens_segment_ids"]
    control_flow = np.where((positions == 0) & (segments > 0), PROMPT, packed["control_flow"])
    row = {k: np.asarray(packed[k], BATCH_DTYPES[k]) for k in EXAMPLE_KEYS}
    row.update(
        positions=positions.astype(np.int32),
        segment_ids=segments.astype(np.int32),
        control_flow=np.where(segments > 0, control_flow, PAD).astype(np.int32),
    )
    return row


def _stream_row(packed: dict) -> dict:
    real = packed["tokens_segment_ids"] > 0  # only the stream's last row has padding, at its end
    tokens = np.where(real, packed["tokens"], 0).astype(np.int32)
    supervised = real & np.append(real[1:], False)  # the next token is in this row
    return {
        "tokens": tokens,
        "targets": np.where(supervised, np.append(tokens[1:], 0), 0).astype(np.int32),
        "loss_mask": supervised.astype(np.float32),
        "positions": np.where(real, np.arange(len(tokens)), 0).astype(np.int32),
        "segment_ids": real.astype(np.int32),
        "control_flow": np.where(real, RECURRENT, PAD).astype(np.int32),
    }


def _stack_rows(rows: Sequence[dict], batch_size: int, seq_len: int) -> dict[str, np.ndarray]:
    batch = {k: np.zeros((batch_size, seq_len), BATCH_DTYPES[k]) for k in BATCH_DTYPES}
    for i, row in enumerate(rows):
        for key in BATCH_DTYPES:
            batch[key][i] = row[key]
    if "length" in rows[0]:
        batch["length"] = np.zeros(batch_size, np.int32)
        batch["length"][: len(rows)] = [row["length"] for row in rows]
    return batch
