"""Variable assignment (Saunshi et al., 2024), the release's "basic" form; the paper uses depth 5.

The prompt lists shuffled one-letter assignments: `n_base` numeric ones (`a=5`), a chain of aliases
from the query variable down to one numeric variable, and `n_distractors` aliases pointing anywhere.
As in the release's generator, depth d gives a chain of d + 1 alias hops (q=c1, c1=c2, ..., cd=base).
The response is the query's value.
"""

from __future__ import annotations

import dataclasses
import random
import string

HEADER = "Variable assignment. Follow the assignments and fill in the blank.\n"


@dataclasses.dataclass(frozen=True)
class VariableAssignmentConfig:
    depth: int = 5
    n_base: int = 8
    n_distractors: int = 6
    min_value: int = 0
    max_value: int = 9

    def __post_init__(self):
        if self.depth < 0 or self.n_base < 1 or self.n_distractors < 0 or self.min_value > self.max_value:
            raise ValueError(f"invalid variable-assignment config {self}")
        if self.n_base + self.depth + 1 + self.n_distractors > len(string.ascii_lowercase):
            raise ValueError("n_base + depth + 1 + n_distractors must be <= 26 (one-letter variable names)")


def make_variable_assignment_example(
    rng: random.Random, index: int, config: VariableAssignmentConfig
) -> dict:
    del index  # every example has the same shape
    names = rng.sample(string.ascii_lowercase, config.n_base + config.depth + 1 + config.n_distractors)
    base = names[: config.n_base]
    chain = names[config.n_base : config.n_base + config.depth + 1]
    distractors = names[config.n_base + config.depth + 1 :]
    values = {v: rng.randint(config.min_value, config.max_value) for v in base}
    sink = rng.choice(base)

    lines = [f"{v}={values[v]}" for v in base]
    hops = chain[1:] + [sink]
    lines += [f"{left}={right}" for left, right in zip(chain, hops)]
    # Distractors may point at any other variable, distractors included: they never reach the query's chain.
    lines += [f"{d}={rng.choice([v for v in names if v != d])}" for d in distractors]
    rng.shuffle(lines)

    prompt = HEADER + "\n".join(lines) + f"\n{chain[0]}=___\nAnswer: | "
    return {
        "prompt": prompt,
        "response": str(values[sink]),
        "answer": str(values[sink]),
        "query": chain[0],
        "depth": config.depth,
    }
