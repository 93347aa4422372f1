import json

import grain
import numpy as np
import pytest
import tokenizers

from t2mlr_jax.data.batch import validate_batch
from t2mlr_jax.data.char_tokenizer import S5CharTokenizer
from t2mlr_jax.data.pipeline import file_batches, task_batches, text_batches
from t2mlr_jax.data.s5_retrieval import encode_s5_retrieval
from t2mlr_jax.data.tasks import GeneratedTaskSource
from t2mlr_jax.data.token_store import TokenStoreWriter
from t2mlr_jax.data.tokenizer import TextTokenizer

ONE_HOST = grain.sharding.ShardOptions(shard_index=0, shard_count=1)


def take(iterator, n):
    return [next(iterator) for _ in range(n)]


def assert_same(batches_a, batches_b):
    assert len(batches_a) == len(batches_b)
    for a, b in zip(batches_a, batches_b):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def assert_documents_stay_separate(batch, *, cut_rows_continue: bool):
    """Inside a row, a counted target is the next token of the same segment; segments start at position 0
    with control flow 1 and count up by one."""
    for row in range(batch["tokens"].shape[0]):
        seg, pos, mask = batch["segment_ids"][row], batch["positions"][row], batch["loss_mask"][row]
        for t in range(len(seg)):
            if seg[t] == 0:
                assert mask[t] == 0 and batch["control_flow"][row, t] == 0
                continue
            starts = t == 0 or seg[t - 1] != seg[t]
            assert (pos[t] == 0) == starts and (not starts or batch["control_flow"][row, t] == 1)
            if t + 1 < len(seg) and seg[t + 1] == seg[t]:
                assert pos[t + 1] == pos[t] + 1
                if mask[t]:
                    assert batch["targets"][row, t] == batch["tokens"][row, t + 1]
            elif mask[t] and not (cut_rows_continue and t == len(seg) - 1):
                raise AssertionError(f"loss counted across a document boundary at row {row}, t {t}")


def test_s5_eval_batches_are_the_encoded_records_in_order():
    source = GeneratedTaskSource("s5_retrieval", "test", seed=5, num_examples=5)
    batches = list(
        task_batches(
            "s5_retrieval",
            "test",
            seed=5,
            num_examples=5,
            batch_size=2,
            seq_len=900,
            num_epochs=1,
            shard_options=ONE_HOST,
            vocab_size=188,
        )
    )
    assert len(batches) == 3 and "target_bytes" not in batches[0]  # no bits per byte for S5's char tokens
    tok = S5CharTokenizer()
    for i in range(5):
        batch, row = batches[i // 2], i % 2
        validate_batch(batch, vocab_size=188)
        example = encode_s5_retrieval(source[i], tok)
        n = len(example["tokens"])
        assert (batch["tokens"][row, :n] == example["tokens"]).all() and (
            batch["segment_ids"][row, n:] == 0
        ).all()
        assert (batch["targets"][row, :n] == example["targets"]).all() and batch["length"][row] == source[i][
            "length"
        ]
        assert (batch["positions"][row, :n] == np.arange(n)).all()
    assert (
        batches[2]["length"].tolist() == [5, 0] and batches[2]["loss_mask"][1].sum() == 0
    )  # padded last batch


def test_packed_sft_task_keeps_examples_whole(smollm2):
    batches = take(
        iter(
            task_batches(
                "variable_assignment",
                "train",
                seed=0,
                num_examples=64,
                batch_size=2,
                seq_len=256,
                tokenizer=smollm2,
                packing="documents",
                shard_options=ONE_HOST,
            )
        ),
        3,
    )
    for batch in batches:
        validate_batch(batch, vocab_size=smollm2.vocab_size)
        assert batch["segment_ids"].max() >= 2  # several examples per row
        assert_documents_stay_separate(batch, cut_rows_continue=False)
        ends = batch["tokens"] == smollm2.eos_id
        assert ends.sum() == batch["segment_ids"].max(axis=1).sum()  # every packed example is whole


@pytest.fixture(scope="module")
def token_store(tmp_path_factory, smollm2, play_texts):
    folder = tmp_path_factory.mktemp("store")
    writer = TokenStoreWriter(
        str(folder),
        split="train",
        vocab_size=smollm2.vocab_size,
        eos_id=smollm2.eos_id,
        tokenizer="smollm2",
        documents_per_shard=3,
    )
    for text in play_texts + ["A short one.", "Another short document here."]:
        writer.write(smollm2.encode(text))
    meta = writer.close()
    assert len(meta.files) == 2 and meta.num_documents == 6 and meta.dtype == "uint16"
    return str(folder)


def test_text_packing_never_crosses_documents_and_streams_every_token(token_store, smollm2, play_texts):
    stream = list(
        text_batches(
            token_store,
            batch_size=2,
            seq_len=128,
            num_epochs=1,
            shuffle=False,
            shard_options=ONE_HOST,
            vocab_size=smollm2.vocab_size,
        )
    )
    for batch in stream:
        validate_batch(batch)
        assert_documents_stay_separate(batch, cut_rows_continue=True)
    rows = [b["tokens"][r][b["segment_ids"][r] > 0] for b in stream for r in range(2)]
    documents = play_texts + ["A short one.", "Another short document here."]
    expected = np.concatenate([np.append(smollm2.encode(d), smollm2.eos_id) for d in documents])
    assert (np.concatenate(rows) == expected).all()  # EOS after every document, nothing lost or repeated


def test_train_tokens_keeps_the_streams_first_tokens_and_revisits_them(token_store, smollm2, play_texts):
    """data.train_tokens: an epoch is exactly the stream's first N tokens (the document crossing the mark
    cut), and a row reading three epochs' worth sees nothing else."""
    first = np.append(smollm2.encode(play_texts[0]), smollm2.eos_id)
    n = len(first) + 100  # the first document whole and the second one's first 100 tokens
    expected = np.concatenate([first, smollm2.encode(play_texts[1])[:100]])
    one = text_batches(
        token_store,
        batch_size=1,
        seq_len=64,
        num_epochs=1,
        shuffle=False,
        shard_options=ONE_HOST,
        max_tokens=n,
    )
    read = np.concatenate([b["tokens"][0][b["segment_ids"][0] > 0] for b in one])
    assert (read == expected).all()
    forever = iter(text_batches(token_store, batch_size=2, seq_len=64, shard_options=ONE_HOST, max_tokens=n))
    seen = {int(t) for b in take(forever, 3 * n // 128 + 1) for t in b["tokens"][b["segment_ids"] > 0]}
    assert seen <= set(expected.tolist())
    with pytest.raises(ValueError, match=r"data.train_tokens=10000000: the training text .* holds only \d+"):
        text_batches(token_store, batch_size=1, seq_len=64, shard_options=ONE_HOST, max_tokens=10_000_000)


def test_resuming_from_a_state_gives_the_same_batches(token_store, smollm2):
    dataset = text_batches(
        token_store, tokenizer=smollm2, batch_size=2, seq_len=64, seed=3, shard_options=ONE_HOST
    )
    iterator = iter(dataset)
    take(iterator, 4)
    state = iterator.get_state()
    expected = take(iterator, 4)
    resumed = iter(dataset)
    resumed.set_state(json.loads(json.dumps(state)))  # the state survives a JSON round trip (checkpoints)
    assert_same(take(resumed, 4), expected)
    assert "target_bytes" in expected[0]


def test_raw_files_match_the_token_store(token_store, tmp_path, smollm2, play_texts):
    folder = tmp_path / "docs"
    folder.mkdir()
    for i, text in enumerate(play_texts):
        (folder / f"{i}.txt").write_text(text, encoding="utf-8")
    (folder / "more.jsonl").write_text(
        "\n".join(json.dumps({"text": t}) for t in ["A short one.", "Another short document here."])
    )
    raw = text_batches(
        str(folder),
        tokenizer=smollm2,
        batch_size=2,
        seq_len=64,
        num_epochs=1,
        shuffle=False,
        shard_options=ONE_HOST,
    )
    stored = text_batches(
        token_store,
        tokenizer=smollm2,
        batch_size=2,
        seq_len=64,
        num_epochs=1,
        shuffle=False,
        shard_options=ONE_HOST,
    )
    assert_same(list(raw), list(stored))


def test_text_batches_carry_the_utf8_bytes_of_every_target(tmp_path, token_store, smollm2, play_texts):
    documents = play_texts + ["héllo wörld ✓ 日本", "🤗 don't<|im_end|> stop"]
    for i, text in enumerate(documents):
        (tmp_path / f"{i}.txt").write_text(text, encoding="utf-8")
    stream = list(
        text_batches(
            str(tmp_path),
            tokenizer=smollm2,
            batch_size=2,
            seq_len=128,
            num_epochs=1,
            shuffle=False,
            shard_options=ONE_HOST,
        )
    )
    for batch in stream:
        validate_batch(batch)
        counted = batch["loss_mask"] > 0
        assert (batch["target_bytes"][counted] == smollm2.byte_lengths[batch["targets"][counted]]).all()
        assert (batch["target_bytes"][batch["targets"] == smollm2.eos_id] == 0).all()
    # Every token of a document but its first is a target once (also across cut rows); EOS and other
    # special tokens count 0 bytes.
    expected = sum(
        len(d.encode("utf-8")) - int(smollm2.byte_lengths[smollm2.encode(d)[0]]) for d in documents
    ) - len("<|im_end|>")
    assert sum(int(b["target_bytes"].sum()) for b in stream) == expected
    without = next(iter(text_batches(token_store, batch_size=2, seq_len=128, shard_options=ONE_HOST)))
    assert "target_bytes" not in without  # a token store without its tokenizer: the metric is absent


def test_a_token_store_refuses_another_tokenizer(token_store, tmp_path):
    from t2mlr_jax.data.tokenizer import TextTokenizer

    other = tokenizers.Tokenizer(tokenizers.models.BPE())
    other.add_special_tokens(["<eos>"])
    with pytest.raises(ValueError, match="not the one the token store was written with"):
        text_batches(token_store, tokenizer=TextTokenizer(other, 0), batch_size=1, seq_len=8)


def test_hosts_get_disjoint_shards(token_store):
    seen = []
    for index in range(2):
        shard = grain.sharding.ShardOptions(shard_index=index, shard_count=2)
        stream = text_batches(
            token_store, batch_size=1, seq_len=4096, num_epochs=1, shuffle=False, shard_options=shard
        )
        seen.append({int(b["tokens"][0, 0]) for b in stream})  # first tokens of each packed row
    assert seen[0] and seen[1] and not seen[0] & seen[1]


def test_gsm8k_file_batches_supervise_only_responses(tmp_path, smollm2):
    path = tmp_path / "gsm.jsonl"
    rows = [
        {"question": f"What is {i}+{i}?", "steps": [f"<<{i}+{i}={2 * i}>>"], "answer": str(2 * i)}
        for i in range(6)
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    batch = next(
        iter(
            file_batches(
                str(path),
                format="gsm8k_aug",
                tokenizer=smollm2,
                batch_size=6,
                seq_len=64,
                num_epochs=1,
                shuffle=False,
                shard_options=ONE_HOST,
            )
        )
    )
    validate_batch(batch)
    for row in range(6):
        counted = batch["targets"][row][batch["loss_mask"][row] > 0]
        response = f"<<{row}+{row}={2 * row}>>\n### {2 * row}"
        assert smollm2.decode(counted) == response + "<|im_end|>"
        assert batch["target_bytes"][row].sum() == len(response.encode())  # <|im_end|> counts 0 bytes
        recurrent = batch["tokens"][row][batch["control_flow"][row] == 2]
        assert smollm2.decode(recurrent).startswith("<<")


def test_worker_processes_give_the_same_batches():
    kwargs = dict(seed=0, num_examples=64, batch_size=4, seq_len=900, shard_options=ONE_HOST)
    expected = take(iter(task_batches("s5_retrieval", "train", **kwargs)), 2)
    iterator = iter(task_batches("s5_retrieval", "train", worker_count=1, **kwargs))
    assert_same(take(iterator, 2), expected)
    iterator.close()


def test_bad_inputs_raise_clear_errors(tmp_path, smollm2, token_store):
    with pytest.raises(ValueError, match="does not exist"):
        text_batches(str(tmp_path / "missing"), tokenizer=smollm2, batch_size=1, seq_len=8)
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ValueError, match="is empty"):
        text_batches(str(tmp_path / "empty.txt"), tokenizer=smollm2, batch_size=1, seq_len=8)
    with pytest.raises(ValueError, match="larger than the model's vocab_size"):
        text_batches(str(tmp_path / "empty.txt"), tokenizer=smollm2, vocab_size=1000, batch_size=1, seq_len=8)
    with pytest.raises(ValueError, match="vocabulary of 49152 > the model's 1000"):
        text_batches(token_store, vocab_size=1000, batch_size=1, seq_len=8)
    with pytest.raises(ValueError, match="reach 841 tokens > seq_len 512"):
        task_batches("s5_retrieval", "test", seed=0, num_examples=4, batch_size=1, seq_len=512)
    with pytest.raises(ValueError, match="unknown task"):
        task_batches("s6", "test", seed=0, num_examples=4, batch_size=1, seq_len=512)
    long = task_batches(
        "pathfinding",
        "test",
        seed=0,
        num_examples=4,
        batch_size=1,
        seq_len=32,
        tokenizer=smollm2,
        num_epochs=1,
        shard_options=ONE_HOST,
    )
    with pytest.raises(ValueError, match="does not fit seq_len 32"):
        next(iter(long))
    bad_store = tmp_path / "bad_store"
    writer = TokenStoreWriter(str(bad_store), split="train", vocab_size=100, eos_id=1, tokenizer="toy")
    writer.write(np.array([5, 150], np.int32))
    writer.close()
    with pytest.raises(ValueError, match="token id 150 >= vocab size 100"):
        next(
            iter(
                text_batches(str(bad_store), vocab_size=100, batch_size=1, seq_len=8, shard_options=ONE_HOST)
            )
        )


def test_training_text_of_less_than_one_batch_is_refused(
    tmp_path, monkeypatch, smollm2, token_store, play_texts
):
    """A whitespace file (of any size), empty texts, or a corpus shorter than one batch of tokens that carry
    text trains on EOS, whitespace or a few tokens repeated: refused, naming the file. Only the first
    documents are read. Evaluation text must hold one token that carries text."""
    (tmp_path / "blank.txt").write_text("  \n\n   \n")
    (tmp_path / "big_blank.txt").write_text(" \t \n\n\t  " * 1000)  # 9 kB: its whitespace tokens are no text
    (tmp_path / "empty_texts.jsonl").write_text('{"text": ""}\n' * 500)
    (tmp_path / "markers.jsonl").write_text('{"text": "<|im_end|><|endoftext|>"}\n' * 500)
    for name in ("blank.txt", "big_blank.txt", "empty_texts.jsonl", "markers.jsonl"):
        path = str(tmp_path / name)
        with pytest.raises(ValueError, match=f"^the text {path} holds 0 tokens that carry text .* one batch"):
            text_batches(path, tokenizer=smollm2, batch_size=2, seq_len=8, min_tokens=16)
    eval_blank = tmp_path / "eval_blank.txt"
    eval_blank.write_text(" \n\t  \n  \t\n")  # 12 bytes: was scored on its 4 whitespace tokens
    only_text = f"^the text {eval_blank} holds 0 tokens that carry text .* than one:"
    with pytest.raises(ValueError, match=only_text):
        text_batches(str(eval_blank), tokenizer=smollm2, batch_size=2, seq_len=8, min_tokens=1)
    store_tokens = sum(
        len(smollm2.encode(t)) for t in play_texts + ["A short one.", "Another short document here."]
    )
    with pytest.raises(ValueError, match=f"{token_store} holds {store_tokens} tokens .* one batch \\(8192"):
        text_batches(token_store, batch_size=8, seq_len=1024, min_tokens=8 * 1024)
    text_batches(token_store, batch_size=8, seq_len=64, min_tokens=8 * 64)  # enough

    encoded = []
    encode = TextTokenizer.encode
    monkeypatch.setattr(
        TextTokenizer, "encode", lambda self, text: encoded.append(text) or encode(self, text)
    )
    text_batches(documents=play_texts * 100, tokenizer=smollm2, batch_size=8, seq_len=64, min_tokens=8 * 64)
    assert encoded == play_texts[:1]  # a play's opening holds one batch: the rest is not tokenized twice


def test_training_records_of_less_than_one_batch_or_only_eos_are_refused(tmp_path, smollm2):
    path = tmp_path / "sft.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"Say {i}", "response": ""}) + "\n" for i in range(8)))
    kwargs = dict(format="prompt_response", tokenizer=smollm2, batch_size=4, seq_len=32)
    with pytest.raises(
        ValueError, match=f"no example of the training data {path} supervises a token that carries text"
    ):
        file_batches(str(path), **kwargs, min_examples=4)
    with pytest.raises(ValueError, match=f"the training data {path} holds 8 examples, fewer than one batch"):
        file_batches(str(path), **kwargs, min_examples=16)
    path.write_text(path.read_text().replace('""', '"ok"', 1))  # one real response is enough
    file_batches(str(path), **kwargs, min_examples=4)
