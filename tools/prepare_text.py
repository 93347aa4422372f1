#!/usr/bin/env python
"""Tokenize a folder of documents (.txt = one document per file, .jsonl / .parquet = one per row's
text field, e.g. FineWeb-Edu parquet shards) into a token store: array_record shards of token ids, one
record per document, plus metadata.json. Train on it with t2mlr_jax.data.text_batches(<output_dir>).

Example:
  python tools/prepare_text.py --input data/fineweb-edu --output_dir data/fineweb-edu-smollm2 \
      --tokenizer path/to/SmolLM2-135M-Instruct.Q4_1.gguf
"""

from __future__ import annotations

import argparse
import itertools
import sys

from tqdm import tqdm

from t2mlr_jax.data.documents import DOCUMENT_SUFFIXES, iter_documents, list_files
from t2mlr_jax.data.token_store import TokenStoreWriter
from t2mlr_jax.data.tokenizer import load_tokenizer


def _chunks(iterable, size):
    iterator = iter(iterable)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--input", required=True, nargs="+", help="document files or folders")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument(
        "--tokenizer", required=True, help="tokenizer.json, a folder holding it, or a .gguf file"
    )
    parser.add_argument(
        "--eos_token", default=None, help="EOS token string (default: from the tokenizer files)"
    )
    parser.add_argument("--split", default="train", help="shard file name prefix")
    parser.add_argument("--text_key", default="text", help="field holding the text in .jsonl / .parquet")
    parser.add_argument("--documents_per_shard", type=int, default=1_000_000)
    parser.add_argument("--batch_size", type=int, default=1024, help="documents tokenized together")
    args = parser.parse_args(argv)
    try:
        files = list_files(args.input, DOCUMENT_SUFFIXES)
        tokenizer = load_tokenizer(args.tokenizer, eos_token=args.eos_token)
    except ValueError as e:
        parser.error(str(e))

    writer = TokenStoreWriter(
        args.output_dir,
        split=args.split,
        vocab_size=tokenizer.vocab_size,
        eos_id=tokenizer.eos_id,
        tokenizer=args.tokenizer,
        documents_per_shard=args.documents_per_shard,
    )
    skipped = 0
    with tqdm(desc="tokenizing", unit="doc") as progress:
        for file in files:
            for texts in _chunks(iter_documents(file, text_key=args.text_key), args.batch_size):
                for ids in tokenizer.encode_batch(texts):
                    if len(ids):
                        writer.write(ids)
                    else:
                        skipped += 1
                progress.update(len(texts))
    meta = writer.close()
    print(
        f"wrote {meta.num_documents} documents, {meta.num_tokens} tokens ({meta.dtype}) in "
        f"{len(meta.files)} shards to {args.output_dir}; skipped {skipped} empty documents"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
