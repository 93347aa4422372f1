"""Model-free evaluation from predicted token ids: per-token accuracy and sequence exact match, overall
and per length bin (S5-retrieval's N), accumulated over batches."""

from __future__ import annotations

import collections

import numpy as np
from jaxtyping import ArrayLike, Bool, Int, Shaped


def token_accuracy(
    predictions: Int[ArrayLike, "B T"], targets: Int[ArrayLike, "B T"], mask: Shaped[ArrayLike, "B T"]
) -> float:
    """Fraction of masked positions where prediction == target (0.0 if the mask is empty)."""
    counted = np.asarray(mask) > 0
    return float((np.asarray(predictions) == np.asarray(targets))[counted].mean()) if counted.any() else 0.0


def sequence_exact_match(
    predictions: Int[ArrayLike, "B T"], targets: Int[ArrayLike, "B T"], mask: Shaped[ArrayLike, "B T"]
) -> Bool[np.ndarray, " B"]:
    """Per row: every masked position is right. Rows with an empty mask are False."""
    counted = np.asarray(mask) > 0
    wrong = (np.asarray(predictions) != np.asarray(targets)) & counted
    return ~wrong.any(axis=1) & counted.any(axis=1)


class LengthBinnedAccuracy:
    """Accumulates exact match and token accuracy per length bin over batches.

    update(predictions, batch) reads batch["targets"], batch["loss_mask"] and batch["length"]; rows with
    length 0 (padding rows) are skipped. Pass `mask` to score other positions than the loss mask, e.g.
    control_flow == 2 for the action segment of S5 only.
    """

    def __init__(self) -> None:
        self._rows = collections.Counter()
        self._exact = collections.Counter()
        self._tokens = collections.Counter()
        self._correct_tokens = collections.Counter()

    def update(
        self, predictions: Int[ArrayLike, "B T"], batch: dict, mask: Shaped[ArrayLike, "B T"] | None = None
    ) -> None:
        if "length" not in batch:
            raise ValueError(
                "LengthBinnedAccuracy needs batch['length'] (unpacked batches of a generated task)"
            )
        mask = batch["loss_mask"] if mask is None else mask
        counted = np.asarray(mask) > 0
        right = (np.asarray(predictions) == batch["targets"]) & counted
        exact = sequence_exact_match(predictions, batch["targets"], mask)
        for row, length in enumerate(np.asarray(batch["length"]).tolist()):
            if length <= 0:
                continue
            self._rows[length] += 1
            self._exact[length] += int(exact[row])
            self._tokens[length] += int(counted[row].sum())
            self._correct_tokens[length] += int(right[row].sum())

    def result(self) -> dict[int, dict[str, float]]:
        """{length: {"exact_match", "token_accuracy", "count"}}, sorted by length."""
        return {
            n: {
                "exact_match": self._exact[n] / self._rows[n],
                "token_accuracy": self._correct_tokens[n] / max(self._tokens[n], 1),
                "count": float(self._rows[n]),
            }
            for n in sorted(self._rows)
        }
