"""The S5-retrieval character tokenizer, with the release's id layout (vocab 188).

ids 0-3: <pad> <unk> <bos> <eos>; 4-67: the 64 characters a-z A-Z 0-9 ' ' '|';
68-187: the 120 permutation tokens <A_12345> ... <A_54321> in lexicographic order.
"""

from __future__ import annotations

import itertools
import re
import string

import numpy as np
from jaxtyping import Int

SPECIAL_TOKENS = ("<pad>", "<unk>", "<bos>", "<eos>")
CHARACTERS = string.ascii_letters + string.digits + " |"
PERMUTATIONS: tuple[tuple[int, ...], ...] = tuple(itertools.permutations((1, 2, 3, 4, 5)))
_PERMUTATION_TOKEN = re.compile(r"<A_[1-5]{5}>")


def permutation_token(perm: tuple[int, ...]) -> str:
    """`(2, 1, 3, 4, 5)` -> `'<A_21345>'`."""
    return "<A_" + "".join(map(str, perm)) + ">"


class S5CharTokenizer:
    """Characters are single tokens; `<A_xxxxx>` permutation tokens are atomic."""

    def __init__(self) -> None:
        self.tokens: tuple[str, ...] = (
            SPECIAL_TOKENS + tuple(CHARACTERS) + tuple(map(permutation_token, PERMUTATIONS))
        )
        self._ids = {tok: i for i, tok in enumerate(self.tokens)}
        self.pad_id, self.unk_id, self.bos_id, self.eos_id = range(4)
        self.special_ids = frozenset(range(len(SPECIAL_TOKENS)))
        self.textless_ids = self.special_ids | {self._ids[" "]}  # what the degenerate-data checks skip

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def token_to_id(self, token: str) -> int:
        return self._ids[token]

    def encode(self, text: str) -> Int[np.ndarray, " n"]:
        """Text -> int32 ids; characters outside the alphabet raise (the release maps them to <unk>,
        which would silently corrupt generated data)."""
        ids, i = [], 0
        while i < len(text):
            match = _PERMUTATION_TOKEN.match(text, i)
            piece = match.group(0) if match else text[i]
            if piece not in self._ids:
                raise ValueError(f"character {piece!r} at offset {i} is not in the S5 char vocabulary")
            ids.append(self._ids[piece])
            i += len(piece)
        return np.asarray(ids, dtype=np.int32)

    def decode(self, ids) -> str:
        return "".join(self.tokens[int(i)] for i in ids)
