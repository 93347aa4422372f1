"""Data pipelines: records or documents -> examples -> batches (the contract in t2mlr_jax.data.batch).

Three entry points return a grain IterDataset of batches; `iter()` on it gives a checkpointable iterator
(`get_state()` / `set_state()` resume the exact same batches):

- task_batches: a generated task, records produced on the fly.
- file_batches: records from a file (generated datasets written by tools/make_dataset.py, GSM8K-Aug,
  HotpotQA CoT, any prompt/response JSONL).
- text_batches: pretraining text, raw files tokenized on the fly or token stores written by
  tools/prepare_text.py, EOS after every document, packed.

Packing (`data.packing`): task and file examples are one per row ("none") or packed whole ("documents");
text is packed "documents" (every document its own segment: attention masked, positions restarting and R
reset at each document, its first token non-recurrent) or "concat" (the release's pretraining layout: one
stream cut into rows, attention and R crossing documents, every token recurrent).

Every pipeline shards its examples per host (grain ShardByJaxProcess unless shard_options is given),
shuffles, repeats num_epochs times (None = forever), packs or pads to seq_len, batches, and optionally
runs `worker_count` grain worker processes. Batches of a byte-level text tokenizer also carry
`target_bytes` (the UTF-8 bytes of each supervised target token), from which the loss reports bits per
byte; the S5 char tokenizer's batches do not.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Collection, Iterable, Sequence

import grain
import numpy as np
from jaxtyping import Int

from t2mlr_jax.data.batch import PROMPT, RECURRENT
from t2mlr_jax.data.batching import batch_examples
from t2mlr_jax.data.char_tokenizer import S5CharTokenizer
from t2mlr_jax.data.documents import DOCUMENT_SUFFIXES, iter_documents, list_files, read_records
from t2mlr_jax.data.s5_retrieval import S5RetrievalConfig, encode_s5_retrieval
from t2mlr_jax.data.sft import encode_prompt_response, gsm8k_aug_record, hotpotqa_record
from t2mlr_jax.data.tasks import GeneratedTaskSource
from t2mlr_jax.data.token_store import METADATA_FILE, TokenStoreMetadata, TokenStoreSource, read_metadata
from t2mlr_jax.data.tokenizer import TextTokenizer, load_tokenizer

RECORD_FORMATS = ("s5_retrieval", "prompt_response", "gsm8k_aug", "hotpotqa")
EXAMPLE_PACKINGS = ("none", "documents")  # task and file examples
TEXT_PACKINGS = ("documents", "concat")  # pretraining text
_ROW_CONVERTERS = {"gsm8k_aug": gsm8k_aug_record, "hotpotqa": hotpotqa_record}


# ----------------------------------------------------------------------------------------------------------
# Records -> examples


def record_encoder(
    format: str,
    tokenizer: TextTokenizer | S5CharTokenizer | None,
    *,
    chat: bool = False,
    all_recurrent: bool = False,
    prompt_loss: bool = False,
) -> Callable[[dict], dict]:
    """A function record -> example for one of RECORD_FORMATS (options: see sft.encode_prompt_response)."""
    if format not in RECORD_FORMATS:
        raise ValueError(f"unknown record format {format!r}; expected one of {RECORD_FORMATS}")
    if format == "s5_retrieval":
        char_tokenizer = tokenizer or S5CharTokenizer()
        if not isinstance(char_tokenizer, S5CharTokenizer):
            raise ValueError("S5-retrieval records need the S5 char tokenizer (pass tokenizer=None)")
        return lambda record: encode_s5_retrieval(record, char_tokenizer)
    if not isinstance(tokenizer, TextTokenizer):
        raise ValueError(f"{format} records need a text tokenizer (a TextTokenizer or a path to one)")
    to_record = _ROW_CONVERTERS.get(format, _prompt_response_record)

    def encode(row: dict) -> dict:
        record = to_record(row)
        return encode_prompt_response(
            record["prompt"],
            record["response"],
            tokenizer,
            chat=chat,
            all_recurrent=all_recurrent,
            prompt_loss=prompt_loss,
        )

    return encode


def _prompt_response_record(row: dict) -> dict:
    if not isinstance(row.get("prompt"), str) or not isinstance(row.get("response"), str):
        raise ValueError(
            f"prompt_response record needs string 'prompt' and 'response' fields (has {sorted(row)})"
        )
    return row


def document_example(ids: Int[np.ndarray, " n"], eos_id: int) -> dict[str, np.ndarray]:
    """A pretraining document: ids + EOS, next-token targets inside the document, recurrent after the
    first token (the release's text-only control flow under its packed collator). Each array is written
    once, whole: a document costs a few numpy calls however long it is."""
    n = len(ids) + 1
    tokens = np.empty(n, np.int32)
    tokens[:-1], tokens[-1] = ids, eos_id
    targets = np.zeros(n, np.int32)
    targets[:-1] = tokens[1:]
    loss_mask = np.ones(n, np.float32)
    loss_mask[-1] = 0.0
    control_flow = np.full(n, RECURRENT, np.int32)
    control_flow[0] = PROMPT
    return {"tokens": tokens, "targets": targets, "loss_mask": loss_mask, "control_flow": control_flow}


def add_target_bytes(batch: dict, byte_lengths: Int[np.ndarray, " vocab"]) -> dict:
    """The batch plus `target_bytes`: byte_lengths of each target where loss_mask counts, else 0."""
    counted = batch["loss_mask"] > 0
    target_bytes = np.where(counted, byte_lengths[np.where(counted, batch["targets"], 0)], 0)
    return {**batch, "target_bytes": target_bytes.astype(np.int32)}


def target_byte_lengths(tokenizer: TextTokenizer | S5CharTokenizer | None) -> np.ndarray | None:
    """Each token's UTF-8 byte length when batches of `tokenizer` carry `target_bytes` (a byte-level text
    tokenizer), else None."""
    if not isinstance(tokenizer, TextTokenizer):
        return None
    try:
        return tokenizer.byte_lengths
    except ValueError as e:
        logging.warning("no bits-per-byte metric: %s", e)
        return None


def _with_target_bytes(batches: grain.IterDataset, tokenizer: TextTokenizer | None) -> grain.IterDataset:
    """Batches with `target_bytes` when `tokenizer` is a byte-level text tokenizer; unchanged otherwise."""
    byte_lengths = target_byte_lengths(tokenizer)
    if byte_lengths is None:
        return batches
    return batches.map(lambda batch: add_target_bytes(batch, byte_lengths))


def _check_store_tokenizer(metadata: TokenStoreMetadata, tokenizer: TextTokenizer) -> None:
    if (metadata.vocab_size, metadata.eos_id) != (tokenizer.vocab_size, tokenizer.eos_id):
        raise ValueError(
            f"the tokenizer (vocabulary {tokenizer.vocab_size}, EOS {tokenizer.eos_id}) is not the one the "
            f"token store was written with ({metadata.tokenizer!r}: vocabulary {metadata.vocab_size}, "
            f"EOS {metadata.eos_id})"
        )


# ----------------------------------------------------------------------------------------------------------
# Training data holds one batch
#
# Training repeats its data forever, so too little data does not fail: it trains on a few tokens over and
# over, or (a whitespace file, empty texts, empty responses) on EOS alone. One batch is what the data must
# hold before it repeats: text, batch_size x seq_len tokens that carry text (not special tokens such as EOS
# or chat markers, not whitespace alone; the packed stream adds an EOS per document on top); task and file
# examples, batch_size examples (one per row, as they are unpacked), one of which supervises a token that
# carries text. Evaluation text must hold one such token. Both read the data in order only until that is
# met: one batch's tokenization at start-up, whatever the corpus size.


def _carries_text(ids: Int[np.ndarray, " n"], textless_ids: Collection[int]) -> np.ndarray:
    return ~np.isin(ids, list(textless_ids))


def _require_tokens(
    documents: Iterable[Int[np.ndarray, " n"]], textless_ids: Collection[int], min_tokens: int, where: str
) -> None:
    count = 0
    for ids in documents:
        count += int(np.count_nonzero(_carries_text(ids, textless_ids)))
        if count >= min_tokens:
            return
    need = "one" if min_tokens == 1 else f"one batch ({min_tokens} = batch size x seq_len)"
    raise ValueError(
        f"the text {where} holds {count} tokens that carry text (not whitespace alone, not special tokens "
        f"such as EOS), fewer than {need}: give more text" + (" or a smaller batch" if min_tokens > 1 else "")
    )


def first_tokens(examples: grain.MapDataset, max_tokens: int, where: str) -> grain.MapDataset:
    """The stream's first `max_tokens` positions: its first documents whole, the one that crosses the mark
    cut there (its last kept target stays supervised: the next token is known)."""
    total = 0
    for count in range(1, len(examples) + 1):
        length = len(examples[count - 1]["tokens"])
        if total + length >= max_tokens:
            keep, last = max_tokens - total, count - 1
            # (the index a repeated dataset passes on runs past the epoch: taken modulo it)
            cut = lambda i, ex: {k: v[:keep] for k, v in ex.items()} if i % count == last else ex
            return examples[:count].map_with_index(cut)
        total += length
    raise ValueError(f"data.train_tokens={max_tokens}: the training text {where} holds only {total} tokens")


def _require_examples(
    records: Sequence[dict], encode: Callable, textless_ids: Collection[int], min_examples: int, where: str
) -> None:
    if len(records) < min_examples:
        raise ValueError(
            f"the training data {where} holds {len(records)} examples, fewer than one batch "
            f"({min_examples} = batch size): give more examples or a smaller batch"
        )
    for i in range(len(records)):
        example = encode(records[i])
        if np.any((example["loss_mask"] > 0) & _carries_text(example["targets"], textless_ids)):
            return
    raise ValueError(
        f"no example of the training data {where} supervises a token that carries text (not whitespace "
        "alone, not special tokens such as EOS): "
        "are its responses empty?"
    )


# ----------------------------------------------------------------------------------------------------------
# Entry points


def _as_text_tokenizer(tokenizer: TextTokenizer | str | None) -> TextTokenizer | None:
    return load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer


def _check_vocab(tokenizer_vocab: int, vocab_size: int | None) -> None:
    if vocab_size is not None and tokenizer_vocab > vocab_size:
        raise ValueError(
            f"tokenizer vocabulary ({tokenizer_vocab}) is larger than the model's vocab_size "
            f"({vocab_size}): tokenizer/vocab mismatch"
        )


def _example_packing(packing: str) -> str:
    if packing not in EXAMPLE_PACKINGS:
        raise ValueError(
            f"packing of task / file examples must be one of {EXAMPLE_PACKINGS}, got {packing!r}"
        )
    return "first_fit" if packing == "documents" else "none"


def task_batches(
    task: str,
    split: str,
    *,
    seed: int,
    num_examples: int,
    batch_size: int,
    seq_len: int,
    tokenizer: TextTokenizer | str | None = None,
    vocab_size: int | None = None,
    packing: str = "none",
    chat: bool = False,
    all_recurrent: bool = False,
    prompt_loss: bool = False,
    shuffle: bool | None = None,
    num_epochs: int | None = None,
    shard_options: grain.sharding.ShardOptions | None = None,
    worker_count: int = 0,
    **task_config,
) -> grain.IterDataset:
    """Batches of a generated task (s5_retrieval, variable_assignment, prosqa, pathfinding).

    S5-retrieval uses its char tokenizer (pass tokenizer=None); the others need the text tokenizer.
    Unpacked batches carry batch["length"] (S5: N) for LengthBinnedAccuracy. Training defaults to
    shuffled, repeated forever; pass num_epochs=1, shuffle=False for evaluation (the last batch is then
    padded with empty rows).
    """
    source = GeneratedTaskSource(task, split, seed=seed, num_examples=num_examples, **task_config)
    text_tokenizer = _as_text_tokenizer(tokenizer)
    encode = record_encoder(
        source.spec.format, text_tokenizer, chat=chat, all_recurrent=all_recurrent, prompt_loss=prompt_loss
    )
    if isinstance(source.config, S5RetrievalConfig):
        _check_vocab(S5CharTokenizer().vocab_size, vocab_size)
        if packing == "none" and source.config.max_tokens > seq_len:
            raise ValueError(
                f"S5-retrieval examples reach {source.config.max_tokens} tokens > seq_len {seq_len}"
            )
    else:
        _check_vocab(text_tokenizer.vocab_size, vocab_size)
    examples = grain.MapDataset.source(source).map(encode)
    batches = batch_examples(
        examples,
        batch_size=batch_size,
        seq_len=seq_len,
        packing=_example_packing(packing),
        seed=seed,
        shuffle=split == "train" if shuffle is None else shuffle,
        num_epochs=num_epochs,
        shard_options=shard_options,
        worker_count=worker_count,
        drop_remainder=num_epochs is None,
    )
    return _with_target_bytes(
        batches, None if isinstance(source.config, S5RetrievalConfig) else text_tokenizer
    )


class JsonRecordSource:
    """grain RandomAccessDataSource over array_record files of JSON records (tools/make_dataset.py)."""

    def __init__(self, files: Sequence[str]):
        self._records = grain.sources.ArrayRecordDataSource(list(files))

    def __len__(self) -> int:
        return len(self._records)

    def __getitem__(self, index: int) -> dict:
        return json.loads(self._records[index])


def load_records(path: str) -> list[dict] | JsonRecordSource:
    """Records of a .jsonl / .json / .parquet file, or of .array_record files (a file or a folder)."""
    if path.endswith((".jsonl", ".json", ".parquet")):
        return read_records(path)
    return JsonRecordSource(list_files(path, (".array_record",)))


def file_batches(
    path: str,
    *,
    format: str,
    batch_size: int,
    seq_len: int,
    tokenizer: TextTokenizer | str | None = None,
    vocab_size: int | None = None,
    packing: str = "none",
    chat: bool = False,
    all_recurrent: bool = False,
    prompt_loss: bool = False,
    seed: int = 0,
    shuffle: bool = True,
    num_epochs: int | None = None,
    shard_options: grain.sharding.ShardOptions | None = None,
    worker_count: int = 0,
    min_examples: int = 0,
) -> grain.IterDataset:
    """Batches of records read from `path` in one of RECORD_FORMATS (gsm8k_aug, hotpotqa, prompt_response,
    s5_retrieval). `min_examples` (training: the batch size): the file must hold one batch of examples,
    one of which supervises a token that carries text (see "Training data holds one batch")."""
    text_tokenizer = _as_text_tokenizer(tokenizer)
    encode = record_encoder(
        format, text_tokenizer, chat=chat, all_recurrent=all_recurrent, prompt_loss=prompt_loss
    )
    token_ids = S5CharTokenizer() if format == "s5_retrieval" else text_tokenizer
    _check_vocab(token_ids.vocab_size, vocab_size)
    records = load_records(path)
    if min_examples:
        _require_examples(records, encode, token_ids.textless_ids, min_examples, path)
    examples = grain.MapDataset.source(records).map(encode)
    batches = batch_examples(
        examples,
        batch_size=batch_size,
        seq_len=seq_len,
        packing=_example_packing(packing),
        seed=seed,
        shuffle=shuffle,
        num_epochs=num_epochs,
        shard_options=shard_options,
        worker_count=worker_count,
        drop_remainder=num_epochs is None,
    )
    return _with_target_bytes(batches, None if format == "s5_retrieval" else text_tokenizer)


def text_batches(
    paths: str | Sequence[str] = (),
    *,
    documents: Sequence[str] | None = None,
    batch_size: int,
    seq_len: int,
    tokenizer: TextTokenizer | str | None = None,
    vocab_size: int | None = None,
    text_key: str = "text",
    packing: str = "documents",
    seed: int = 0,
    shuffle: bool = True,
    num_epochs: int | None = None,
    shard_options: grain.sharding.ShardOptions | None = None,
    worker_count: int = 0,
    min_tokens: int = 0,
    max_tokens: int = 0,
) -> grain.IterDataset:
    """Packed pretraining batches (`packing`: documents | concat). `paths`: token-store folders (with
    metadata.json, from tools/prepare_text.py), or raw .txt/.jsonl/.parquet files or folders, tokenized on
    the fly with `tokenizer` (small corpora: raw documents are held in memory). With a (byte-level)
    tokenizer the batches carry `target_bytes`; a token store then needs the tokenizer it was written
    with. `documents` instead of `paths`: any random-access sequence of raw documents (e.g.
    tfds_source.TfdsDocuments), read lazily and tokenized on the fly. `min_tokens` (training: batch_size x
    seq_len): the text must hold this many tokens that carry text (see "Training data holds one
    batch"), counted on its first documents. `max_tokens` (data.train_tokens): only the stream's first
    this many tokens, the document that crosses the mark cut there."""
    if packing not in TEXT_PACKINGS:
        raise ValueError(f"packing of text must be one of {TEXT_PACKINGS}, got {packing!r}")
    path_list = [paths] if isinstance(paths, str) else list(paths)
    if bool(path_list) == (documents is not None):
        raise ValueError("text_batches takes either paths or documents")
    for path in path_list:
        if not os.path.exists(path):
            raise ValueError(f"data path {path!r} does not exist")
    stores = [p for p in path_list if os.path.isfile(os.path.join(p, METADATA_FILE))]
    if stores and len(stores) != len(path_list):
        raise ValueError("text_batches takes either token-store folders or raw document files, not both")
    text_tokenizer = _as_text_tokenizer(tokenizer)
    if stores:
        source = TokenStoreSource(stores, vocab_size=vocab_size)
        if text_tokenizer is not None:
            for store in stores:
                _check_store_tokenizer(read_metadata(store), text_tokenizer)
        eos_id = source.metadata.eos_id
        if min_tokens:
            textless_ids = text_tokenizer.textless_ids if text_tokenizer else {eos_id}
            documents_ids = (source[i] for i in range(len(source)))
            _require_tokens(documents_ids, textless_ids, min_tokens, ", ".join(path_list))
        examples = grain.MapDataset.source(source).map(lambda ids: document_example(ids, eos_id))
    else:
        if text_tokenizer is None:
            raise ValueError("raw text files need a tokenizer (a TextTokenizer or a path to one)")
        _check_vocab(text_tokenizer.vocab_size, vocab_size)
        if documents is None:
            documents = [
                doc
                for file in list_files(path_list, DOCUMENT_SUFFIXES)
                for doc in iter_documents(file, text_key=text_key)
            ]
            if not documents:
                raise ValueError(f"no documents in {path_list}")
        if min_tokens:
            where = ", ".join(path_list) or getattr(documents, "spec", "the documents given")
            documents_ids = (text_tokenizer.encode(documents[i]) for i in range(len(documents)))
            _require_tokens(documents_ids, text_tokenizer.textless_ids, min_tokens, where)
        examples = grain.MapDataset.source(documents).map(
            lambda doc: document_example(text_tokenizer.encode(doc), text_tokenizer.eos_id)
        )
    if max_tokens:
        examples = first_tokens(examples, max_tokens, ", ".join(path_list) or "given")
    batches = batch_examples(
        examples,
        batch_size=batch_size,
        seq_len=seq_len,
        packing="concat_split" if packing == "documents" else "concat",
        seed=seed,
        shuffle=shuffle,
        num_epochs=num_epochs,
        shard_options=shard_options,
        worker_count=worker_count,
        drop_remainder=num_epochs is None,
    )
    return _with_target_bytes(batches, text_tokenizer)
