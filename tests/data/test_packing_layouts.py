"""data.packing for text: "concat" (the release's layout: attention and R cross documents) and
"documents" (ours: they never do), checked on the rows and on a T²MLR model's exact recurrence."""

import grain
import jax.numpy as jnp
import numpy as np
import pytest

from t2mlr_jax.data.batch import RECURRENT, validate_batch
from t2mlr_jax.data.batching import batch_examples
from t2mlr_jax.data.pipeline import document_example
from t2mlr_jax.model.token_layout import make_layout
from tests.tiny import exact, tiny_config, tiny_params

EOS, SEQ = 63, 16
ONE_HOST = grain.sharding.ShardOptions(shard_index=0, shard_count=1)


def documents(first_token: int = 5) -> list[np.ndarray]:
    """Three documents; the first one's tokens start at `first_token` (a perturbation of document 1)."""
    rng = np.random.default_rng(0)
    docs = [rng.integers(1, 60, n).astype(np.int32) for n in (7, 11, 20)]
    docs[0][0] = first_token
    return docs


def rows(packing: str, docs: list[np.ndarray]) -> dict:
    examples = grain.MapDataset.source([document_example(d, EOS) for d in docs])
    batches = batch_examples(
        examples,
        batch_size=3,
        seq_len=SEQ,
        packing=packing,
        shuffle=False,
        num_epochs=1,
        shard_options=ONE_HOST,
        drop_remainder=False,
    )
    return next(iter(batches))


def test_concat_rows_are_one_stream_cut_every_seq_len_tokens():
    batch = rows("concat", documents())
    validate_batch(batch)
    stream = np.concatenate([np.append(d, EOS) for d in documents()])  # 41 tokens: rows of 16, 16, 9
    real = batch["segment_ids"] > 0
    assert (np.concatenate([batch["tokens"][r][real[r]] for r in range(3)]) == stream).all()
    assert real.sum(1).tolist() == [16, 16, 9] and set(np.unique(batch["segment_ids"])) == {0, 1}
    for r, n in enumerate((16, 16, 9)):
        assert (batch["positions"][r, :n] == np.arange(n)).all()  # no restart at document starts
        assert (batch["control_flow"][r, :n] == RECURRENT).all()  # the release's control flow 2
        # every next token of the row is a target, across document boundaries (the EOS predicts the
        # next document); the row's last token is unsupervised (its target starts the next row)
        assert (batch["targets"][r, : n - 1] == batch["tokens"][r, 1:n]).all()
        assert batch["loss_mask"][r, : n - 1].all() and not batch["loss_mask"][r, n - 1 :].any()


@pytest.fixture(scope="module")
def model():
    cfg = tiny_config()
    return cfg, tiny_params(cfg, gamma=0.5)  # the recurrence switched on


def logits(model, batch: dict) -> np.ndarray:
    cfg, params = model
    tokens = jnp.asarray(batch["tokens"][:1])
    layout = make_layout(
        tokens, *(jnp.asarray(batch[k][:1]) for k in ("positions", "segment_ids", "control_flow"))
    )
    return np.asarray(exact(cfg, params, tokens, layout=layout).logits[0])


@pytest.mark.parametrize("packing", ["concat", "concat_split"])
def test_only_concat_lets_attention_and_the_recurrence_cross_documents(model, packing):
    """Changing document 1 changes the logits of document 2 (same row) under concat, never under
    documents (concat_split is data.packing="documents" for text)."""
    before, after = rows(packing, documents(5)), rows(packing, documents(9))
    second = slice(8, SEQ)  # document 2 starts after document 1's 7 tokens and its EOS
    assert (before["tokens"][0, second] == after["tokens"][0, second]).all()
    change = np.abs(logits(model, before)[second] - logits(model, after)[second]).max()
    assert change > 1e-3 if packing == "concat" else change == 0.0
