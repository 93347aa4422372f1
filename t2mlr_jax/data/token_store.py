"""Tokenized documents on disk: array_record shards whose records are the raw token ids of one document
(little-endian uint16 or uint32, no EOS), described by a metadata.json next to them."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
from collections.abc import Sequence

import grain
import numpy as np
from jaxtyping import Int

from t2mlr_jax.data.documents import iter_documents, parse_json, read_text

METADATA_FILE = "metadata.json"
FORMAT = "t2mlr-token-documents-v1"


@dataclasses.dataclass(frozen=True)
class TokenStoreMetadata:
    dtype: str  # "uint16" | "uint32"
    vocab_size: int
    eos_id: int
    tokenizer: str
    files: tuple[str, ...] = ()
    num_documents: int = 0
    num_tokens: int = 0
    format: str = FORMAT


def token_dtype(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 2**16 else "uint32"


class TokenStoreWriter:
    """Writes documents into shards of at most `documents_per_shard` records, then the metadata."""

    def __init__(
        self,
        out_dir: str,
        *,
        split: str,
        vocab_size: int,
        eos_id: int,
        tokenizer: str,
        documents_per_shard: int = 1_000_000,
    ):
        os.makedirs(out_dir, exist_ok=True)
        self._out_dir, self._split, self._per_shard = out_dir, split, documents_per_shard
        self._meta = TokenStoreMetadata(token_dtype(vocab_size), vocab_size, eos_id, tokenizer)
        self._files: list[str] = []
        self._writer = None
        self._in_shard = self._documents = self._tokens = 0

    def write(self, ids: Int[np.ndarray, " n"]) -> None:
        if self._writer is None or self._in_shard == self._per_shard:
            self._open_next_shard()
        self._writer.write(np.asarray(ids, dtype=np.dtype(self._meta.dtype).newbyteorder("<")).tobytes())
        self._in_shard += 1
        self._documents += 1
        self._tokens += len(ids)

    def _open_next_shard(self) -> None:
        from array_record.python.array_record_module import ArrayRecordWriter

        if self._writer is not None:
            self._writer.close()
        name = f"{self._split}-{len(self._files):05d}.array_record"
        self._files.append(name)
        # group_size:1 keeps every record independently readable: grain reads them in random order.
        self._writer = ArrayRecordWriter(os.path.join(self._out_dir, name), "group_size:1")
        self._in_shard = 0

    def close(self) -> TokenStoreMetadata:
        if self._writer is not None:
            self._writer.close()
        meta = dataclasses.replace(
            self._meta, files=tuple(self._files), num_documents=self._documents, num_tokens=self._tokens
        )
        with open(os.path.join(self._out_dir, METADATA_FILE), "w", encoding="utf-8") as f:
            json.dump(dataclasses.asdict(meta), f, indent=2)
        return meta


def write_documents(
    writer: TokenStoreWriter,
    tokenizer,
    files: Sequence[str],
    *,
    text_key: str = "text",
    batch_size: int = 1024,
    progress=None,
) -> int:
    """Tokenize every document of `files` (t2mlr_jax.data.documents) into `writer`, `batch_size` documents
    per `tokenizer.encode_batch`, in file order; empty documents are skipped and counted (returned).
    `progress` (a tqdm, optional) advances by the documents read."""
    skipped = 0
    for file in files:
        documents = iter_documents(file, text_key=text_key)
        while texts := list(itertools.islice(documents, batch_size)):
            for ids in tokenizer.encode_batch(texts):
                if len(ids):
                    writer.write(ids)
                else:
                    skipped += 1
            if progress is not None:
                progress.update(len(texts))
    return skipped


def read_metadata(store_dir: str) -> TokenStoreMetadata:
    path = os.path.join(store_dir, METADATA_FILE)
    if not os.path.isfile(path):
        raise ValueError(f"{store_dir!r} has no {METADATA_FILE}; write it with tools/prepare_text.py")
    raw = parse_json(read_text(path), path)
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise ValueError(f"{path} is not a {FORMAT} metadata file")
    raw["files"] = tuple(raw["files"])
    return TokenStoreMetadata(**raw)


class TokenStoreSource:
    """grain RandomAccessDataSource over the documents of token stores: index -> int32 ids."""

    def __init__(self, store_dirs: str | Sequence[str], *, vocab_size: int | None = None):
        dirs = [store_dirs] if isinstance(store_dirs, str) else list(store_dirs)
        metas = [read_metadata(d) for d in dirs]
        for d, meta in zip(dirs, metas):
            if vocab_size is not None and meta.vocab_size > vocab_size:
                raise ValueError(
                    f"{d} was tokenized with a vocabulary of {meta.vocab_size} > the model's "
                    f"{vocab_size}: tokenizer/vocab mismatch"
                )
            if not meta.files or meta.num_documents == 0:
                raise ValueError(f"token store {d!r} holds no documents")
        if len({(m.dtype, m.eos_id) for m in metas}) != 1:
            raise ValueError(f"token stores {dirs} disagree on dtype or EOS id")
        self.metadata = metas[0]
        self._dtype = np.dtype(self.metadata.dtype).newbyteorder("<")
        self._vocab_size = vocab_size
        self._records = grain.sources.ArrayRecordDataSource(
            [os.path.join(d, f) for d, meta in zip(dirs, metas) for f in meta.files]
        )

    def __len__(self) -> int:
        return len(self._records)

    def __getitem__(self, index: int) -> Int[np.ndarray, " n"]:
        ids = np.frombuffer(self._records[index], dtype=self._dtype).astype(np.int32)
        if self._vocab_size is not None and ids.size and int(ids.max()) >= self._vocab_size:
            raise ValueError(
                f"document {index} holds token id {int(ids.max())} >= vocab size {self._vocab_size}"
            )
        return ids
