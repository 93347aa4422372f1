#!/usr/bin/env python
"""Tokenize a folder of documents (.txt = one document per file, .jsonl / .parquet = one per row's
text field, e.g. FineWeb-Edu parquet shards) into a token store: array_record shards of token ids, one
record per document, plus metadata.json. Train on it with t2mlr_jax.data.text_batches(<output_dir>).

Example:
  python tools/prepare_text.py --input data/fineweb-edu --output_dir data/fineweb-edu-smollm2 \
      --tokenizer path/to/SmolLM2-135M-Instruct.Q4_1.gguf
"""

from __future__ import annotations

import sys

from tqdm import tqdm

from t2mlr_jax import cpu_runtime
from t2mlr_jax.config.cli import OneLineParser
from t2mlr_jax.data.documents import DOCUMENT_SUFFIXES, list_files
from t2mlr_jax.data.token_store import TokenStoreWriter, write_documents
from t2mlr_jax.data.tokenizer import load_tokenizer


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(description=__doc__)
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
    with tqdm(desc="tokenizing", unit="doc") as progress:
        skipped = write_documents(
            writer, tokenizer, files, text_key=args.text_key, batch_size=args.batch_size, progress=progress
        )
    meta = writer.close()
    print(
        f"wrote {meta.num_documents} documents, {meta.num_tokens} tokens ({meta.dtype}) in "
        f"{len(meta.files)} shards to {args.output_dir}; skipped {skipped} empty documents"
    )
    return 0


if __name__ == "__main__":
    cpu_runtime.tune()
    sys.exit(main())
