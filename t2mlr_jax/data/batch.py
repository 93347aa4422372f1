"""The batch contract between the data pipelines and the trainer (single source of truth).

A batch is a dict of numpy arrays, every one of shape [B, T]:

- ``tokens``       int32   model input ids (0 on padding).
- ``targets``      int32   position-aligned labels: the label of position t sits at t. For language
                           modelling and SFT it is the next token of the same document (tokens[t+1]);
                           for S5-retrieval it is the task label of position t (the release's
                           ``label_shift 0``). Never a token of another document.
- ``loss_mask``    float32 1.0 where the loss counts, else 0.0 (padding, prompts of SFT examples,
                           the last token of every document).
- ``positions``    int32   RoPE positions; restart at 0 at every document start (where the model also
                           resets the recurrent cache R to zero). 0 on padding.
- ``segment_ids``  int32   1, 2, ... per packed document in a row; 0 = padding. Attention never
                           crosses segments.
- ``control_flow`` int32   0 padding / 1 prompt or non-recurrent / 2 recurrent (fused with R). The first
                           token of every document is 1, as the release's packed collator forces.

Optional [B, T] arrays (the pipelines add them after batching; a step passes them to the model's loss):

- ``target_bytes`` int32   UTF-8 bytes of the text each target token stands for (the tokenizer's
                           `byte_lengths`; 0 for special tokens such as EOS), 0 where loss_mask is 0.
                           Batches of a byte-level text tokenizer carry it; the loss then reports
                           bits per byte ("bpb"). Batches of the S5 char tokenizer do not.

Optional per-row metadata (unpacked batches of generated tasks only, one example per row):

- ``length``       int32 [B]  the example's size bin (S5: the number of actions N; 0 on padding rows).

An "example" (one document before batching) uses the same keys with 1-D arrays of one length n,
minus ``positions``/``segment_ids`` which batching adds.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from jaxtyping import Shaped

from t2mlr_jax.model.control_flow import PAD, PROMPT, RECURRENT  # noqa: F401  (part of the batch contract)

BATCH_DTYPES: dict[str, type] = {
    "tokens": np.int32,
    "targets": np.int32,
    "loss_mask": np.float32,
    "positions": np.int32,
    "segment_ids": np.int32,
    "control_flow": np.int32,
}
OPTIONAL_DTYPES: dict[str, type] = {"target_bytes": np.int32}
EXAMPLE_KEYS = ("tokens", "targets", "loss_mask", "control_flow")
ROW_METADATA_DTYPES: dict[str, type] = {"length": np.int32}


def validate_batch(batch: Mapping[str, np.ndarray], *, vocab_size: int | None = None) -> None:
    """Raise one clear ValueError when `batch` breaks the contract above; return None otherwise."""
    missing = [k for k in BATCH_DTYPES if k not in batch]
    if missing:
        raise ValueError(f"batch is missing keys {missing}; expected {sorted(BATCH_DTYPES)}")
    unknown = sorted(set(batch) - set(BATCH_DTYPES) - set(OPTIONAL_DTYPES) - set(ROW_METADATA_DTYPES))
    if unknown:
        raise ValueError(f"batch has unknown keys {unknown}")
    shape = np.shape(batch["tokens"])
    if len(shape) != 2:
        raise ValueError(f"batch['tokens'] must be [B, T], got shape {shape}")
    for key, dtype in {**BATCH_DTYPES, **OPTIONAL_DTYPES}.items():
        if key not in batch:
            continue
        value = batch[key]
        if not isinstance(value, np.ndarray) or value.shape != shape:
            raise ValueError(f"batch[{key!r}] must be a numpy array of shape {shape}, got {np.shape(value)}")
        if value.dtype != dtype:
            raise ValueError(f"batch[{key!r}] must be {np.dtype(dtype).name}, got {value.dtype}")
    for key, dtype in ROW_METADATA_DTYPES.items():
        if key in batch:
            value = batch[key]
            if not isinstance(value, np.ndarray) or value.shape != shape[:1] or value.dtype != dtype:
                raise ValueError(f"batch[{key!r}] must be {np.dtype(dtype).name} of shape {shape[:1]}")
    flow = batch["control_flow"]
    if not np.isin(flow, (PAD, PROMPT, RECURRENT)).all():
        raise ValueError("batch['control_flow'] must only hold 0 (pad), 1 (prompt) or 2 (recurrent)")
    if ((batch["segment_ids"] == 0) & (flow != PAD)).any():
        raise ValueError("batch['control_flow'] must be 0 wherever segment_ids is 0 (padding)")
    if "target_bytes" in batch:
        target_bytes = batch["target_bytes"]
        if (target_bytes < 0).any() or ((batch["loss_mask"] == 0) & (target_bytes != 0)).any():
            raise ValueError("batch['target_bytes'] must be >= 0, and 0 wherever loss_mask is 0")
    if vocab_size is not None:
        check_token_ids(batch["tokens"], vocab_size, what="batch['tokens']")
        check_token_ids(batch["targets"], vocab_size, what="batch['targets']")


def check_token_ids(ids: Shaped[np.ndarray, ...], vocab_size: int, *, what: str) -> None:
    """Raise ValueError if any id in `ids` is negative or >= vocab_size (tokenizer/model mismatch)."""
    if ids.size and (int(ids.max()) >= vocab_size or int(ids.min()) < 0):
        raise ValueError(
            f"{what} holds token id {int(ids.max())} (min {int(ids.min())}) outside the vocabulary of "
            f"size {vocab_size}: the tokenizer does not match the model"
        )
