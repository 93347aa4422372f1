"""S5-retrieval: state tracking over S5 interleaved with in-context key->value retrieval.

Layout (the release's, one example; K = value_len):
    input : <A_k1>v1..vK <A_k2>v1..vK ... | <A_a1>' '*K <A_a2>' '*K ... <A_aN>' '*K
    target: <A_k1>v1..vK <A_k2>v1..vK ... | <A_s1>D(.)   <A_s2>D(.)   ... <A_sN>D(.)
with no separators between tokens. s_i = a_1 o ... o a_i is the running state (s_i[j] = s_{i-1}[a_i[j]-1],
starting from the identity 12345). Labels are position-aligned (target[t] labels position t) and every
position is supervised. The dictionary and '|' are non-recurrent (control flow 1), the action segment
recurrent (2).

The retrieved value is D(s_i), keyed by the composed state (the paper's definition, default), or D(a_i),
keyed by the action (the release's generator; `value_key="action"`).
"""

from __future__ import annotations

import dataclasses
import random
import string

import numpy as np

from t2mlr_jax.data.batch import PROMPT, RECURRENT
from t2mlr_jax.data.char_tokenizer import PERMUTATIONS, S5CharTokenizer, permutation_token

IDENTITY = (1, 2, 3, 4, 5)
DELIMITER = "|"
# Train/validation N in 1..32, test N in 1..48 (paper, Section 3.2).
SPLIT_DEFAULTS = {
    split: {"min_actions": 1, "max_actions": hi}
    for split, hi in (("train", 32), ("validation", 32), ("test", 48))
}


@dataclasses.dataclass(frozen=True)
class S5RetrievalConfig:
    min_actions: int = 1
    max_actions: int = 32
    value_len: int = 4  # K
    value_alphabet: str = string.ascii_letters + string.digits
    value_key: str = "state"  # "state" (paper) | "action" (release)
    # Paper: D is defined on all of S5, so the dictionary lists all 120 permutations (unused ones act as
    # distractors). Otherwise it holds the keys that are looked up plus random distractors up to dict_size.
    full_dict: bool = True
    dict_size: int | None = None
    # Actions move only the first `moved_points` points (S_k inside S5): 5 = all of S5 (the paper); 3 = S3
    # and 2 = parity keep the state-tracking structure at a size a CPU can learn in minutes.
    moved_points: int = 5

    def __post_init__(self):
        if not 1 <= self.min_actions <= self.max_actions:
            raise ValueError(
                f"need 1 <= min_actions <= max_actions, got {self.min_actions}..{self.max_actions}"
            )
        if self.value_len < 1:
            raise ValueError(f"value_len must be >= 1, got {self.value_len}")
        if not self.value_alphabet or not set(self.value_alphabet) <= set(
            string.ascii_letters + string.digits
        ):
            raise ValueError("value_alphabet must be a non-empty subset of [a-zA-Z0-9]")
        if self.value_key not in ("state", "action"):
            raise ValueError(f"value_key must be 'state' or 'action', got {self.value_key!r}")
        if not 2 <= self.moved_points <= 5:
            raise ValueError(f"moved_points must be in 2..5, got {self.moved_points}")

    @property
    def actions(self) -> tuple[tuple[int, ...], ...]:
        """The permutations actions are drawn from: those fixing every point above `moved_points`."""
        return tuple(p for p in PERMUTATIONS if p[self.moved_points :] == IDENTITY[self.moved_points :])

    @property
    def max_tokens(self) -> int:
        """Length of the longest example this config can produce."""
        step = 1 + self.value_len
        keys = len(PERMUTATIONS) if self.full_dict else max(self.max_actions, self.dict_size or 0)
        return keys * step + 1 + self.max_actions * step


def apply_action(state: tuple[int, ...], action: tuple[int, ...]) -> tuple[int, ...]:
    """One state transition: new[j] = state[action[j] - 1] (the release's composition order)."""
    return tuple(state[a - 1] for a in action)


def make_s5_retrieval_example(rng: random.Random, index: int, config: S5RetrievalConfig) -> dict:
    """One example as a JSON-serialisable record; N cycles through the length range with `index` so that
    every length is equally frequent."""
    n = config.min_actions + index % (config.max_actions - config.min_actions + 1)
    pool = config.actions
    actions = [rng.choice(pool) for _ in range(n)]
    states, state = [], IDENTITY
    for action in actions:
        state = apply_action(state, action)
        states.append(state)
    lookups = states if config.value_key == "state" else actions

    if config.full_dict:
        keys = list(PERMUTATIONS)
    else:
        keys = list(dict.fromkeys(lookups))
        target_size = max(len(keys), config.dict_size or 0)
        chosen = set(keys)
        while len(keys) < target_size:
            candidate = rng.choice(PERMUTATIONS)
            if candidate not in chosen:
                chosen.add(candidate)
                keys.append(candidate)
    rng.shuffle(keys)
    values = {k: "".join(rng.choice(config.value_alphabet) for _ in range(config.value_len)) for k in keys}

    blank = " " * config.value_len
    dictionary = "".join(permutation_token(k) + values[k] for k in keys)
    actions_text = "".join(permutation_token(a) + blank for a in actions)
    answers_text = "".join(permutation_token(s) + values[key] for s, key in zip(states, lookups))
    prefix_len = len(keys) * (1 + config.value_len) + 1
    return {
        "input": dictionary + DELIMITER + actions_text,
        "target": dictionary + DELIMITER + answers_text,
        "control_flow": [PROMPT] * prefix_len + [RECURRENT] * (n * (1 + config.value_len)),
        "length": n,
        "dict_size": len(keys),
        "actions": ["".join(map(str, a)) for a in actions],
        "states": ["".join(map(str, s)) for s in states],
        "value_key": config.value_key,
    }


def encode_s5_retrieval(record: dict, tokenizer: S5CharTokenizer) -> dict[str, np.ndarray]:
    """Record -> example arrays (see t2mlr_jax.data.batch): position-aligned, all positions supervised."""
    tokens = tokenizer.encode(record["input"])
    targets = tokenizer.encode(record["target"])
    control_flow = np.asarray(record["control_flow"], dtype=np.int32)
    if not len(tokens) == len(targets) == len(control_flow):
        raise ValueError(
            f"S5 record is misaligned: input {len(tokens)}, target {len(targets)}, "
            f"control_flow {len(control_flow)} tokens"
        )
    return {
        "tokens": tokens,
        "targets": targets,
        "loss_mask": np.ones(len(tokens), np.float32),
        "control_flow": control_flow,
        "length": np.int32(record["length"]),
    }
