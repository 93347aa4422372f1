import numpy as np
import pytest

from t2mlr_jax.data.metrics import LengthBinnedAccuracy, sequence_exact_match, token_accuracy


def test_token_accuracy_and_exact_match():
    targets = np.array([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    predictions = np.array([[1, 2, 0], [4, 5, 6], [0, 0, 0]])
    mask = np.array([[1, 1, 0], [1, 1, 1], [0, 0, 0]], np.float32)
    assert token_accuracy(predictions, targets, mask) == 1.0
    assert sequence_exact_match(predictions, targets, mask).tolist() == [True, True, False]
    assert token_accuracy(predictions, targets, np.ones((3, 3))) == pytest.approx(5 / 9)


def test_length_binned_accumulation_skips_padding_rows():
    metric = LengthBinnedAccuracy()
    batch = {
        "targets": np.array([[1, 2], [3, 4], [0, 0]]),
        "loss_mask": np.ones((3, 2), np.float32),
        "length": np.array([2, 2, 0], np.int32),
    }
    metric.update(np.array([[1, 2], [3, 0], [0, 0]]), batch)
    metric.update(np.array([[1, 2], [0, 0], [5, 5]]), {**batch, "length": np.array([5, 2, 0], np.int32)})
    assert metric.result() == {
        2: {"exact_match": 1 / 3, "token_accuracy": 3 / 6, "count": 3.0},
        5: {"exact_match": 1.0, "token_accuracy": 1.0, "count": 1.0},
    }
    with pytest.raises(ValueError, match="length"):
        metric.update(np.zeros((1, 2), int), {"targets": np.zeros((1, 2)), "loss_mask": np.ones((1, 2))})
