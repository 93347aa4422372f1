import numpy as np
import pytest

from t2mlr_jax.data.batch import BATCH_DTYPES, check_token_ids, validate_batch


def good_batch(b=2, t=5):
    batch = {k: np.zeros((b, t), dtype) for k, dtype in BATCH_DTYPES.items()}
    batch["segment_ids"][:, :3] = 1
    batch["control_flow"][:, :3] = [1, 2, 2]
    batch["positions"][:, :3] = [0, 1, 2]
    return batch


def test_valid_batch_passes_with_and_without_length_and_target_bytes():
    batch = good_batch()
    validate_batch(batch, vocab_size=10)
    batch["length"] = np.array([3, 0], np.int32)
    validate_batch(batch)
    batch["loss_mask"][:, :2] = 1.0
    batch["target_bytes"] = np.zeros((2, 5), np.int32)
    batch["target_bytes"][:, :2] = [3, 0]  # 0 for a special token inside the loss
    validate_batch(batch)


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (lambda b: b.pop("targets"), "missing keys"),
        (lambda b: b.update(tokens=b["tokens"].astype(np.int64)), "int32"),
        (lambda b: b.update(loss_mask=np.zeros((2, 4), np.float32)), "shape"),
        (lambda b: b.update(extra=np.zeros((2, 5), np.int32)), "unknown keys"),
        (lambda b: b["control_flow"].__setitem__((0, 4), 2), "padding"),
        (lambda b: b["control_flow"].__setitem__((0, 1), 3), "only hold"),
        (lambda b: b.update(length=np.zeros(3, np.int32)), "length"),
        (lambda b: b.update(target_bytes=np.zeros((2, 5), np.int64)), "target_bytes.*int32"),
        (lambda b: b.update(target_bytes=np.ones((2, 5), np.int32)), "0 wherever loss_mask is 0"),
    ],
)
def test_broken_batches_raise_one_clear_error(corrupt, message):
    batch = good_batch()
    corrupt(batch)
    with pytest.raises(ValueError, match=message):
        validate_batch(batch)


def test_token_ids_outside_the_vocabulary_raise():
    batch = good_batch()
    batch["tokens"][1, 0] = 10
    with pytest.raises(ValueError, match="outside the vocabulary of size 10"):
        validate_batch(batch, vocab_size=10)
    with pytest.raises(ValueError, match="tokenizer does not match"):
        check_token_ids(np.array([-1, 2]), 5, what="ids")
