"""ProsQA-Hard: ProsQA (Hao et al., 2024) enlarged to ~60 concepts and ~8-step proofs (paper, Table 15).

A random DAG of made-up concepts is stated as shuffled "Every X is a Y." sentences, followed by
"<Name> is a <root>." and "Is <Name> a <A> or a <B>?", where exactly one of A, B is reachable. The
response walks one shortest proof path, one sentence per line, then "### <Name> is a <answer>." (the
release formats ProsQA through its steps/answer formatter).

Construction: concepts are numbered in a topological order and split into a "reachable" group (holding
the proof path) and an "unreachable" group (holding the distractor chain); edges only go forward in the
order and never from the reachable group into the unreachable one, so the distractor answer can never
be reached. Extra edges that would shorten the proof are rejected, so the stated path is a shortest one.
"""

from __future__ import annotations

import collections
import dataclasses
import random

NAMES = (
    "Alex",
    "Jordan",
    "Sam",
    "Tom",
    "Max",
    "Sally",
    "Polly",
    "Rex",
    "Wren",
    "Fae",
    "Stella",
    "Bob",
    "Davis",
    "Jack",
    "Lily",
    "Rose",
    "Ivy",
    "Leo",
    "Mia",
    "Noah",
)
_CONSONANTS = "bcdfglmnprstvz"
_VOWELS = "aeiou"


@dataclasses.dataclass(frozen=True)
class ProsQAConfig:
    min_concepts: int = 50
    max_concepts: int = 70
    min_path: int = 6  # proof sentences, the "<Name> is a <root>." one included
    max_path: int = 10
    extra_edges_per_concept: float = 0.8

    def __post_init__(self):
        if not 2 <= self.min_path <= self.max_path or self.min_concepts > self.max_concepts:
            raise ValueError(f"invalid ProsQA config {self}")
        if self.min_concepts < 2 * self.max_path + 2:
            raise ValueError("min_concepts must be >= 2 * max_path + 2 to fit both chains")


def concept_names(rng: random.Random, count: int) -> list[str]:
    """`count` distinct made-up words like 'zolufibus'."""
    names: set[str] = set()
    while len(names) < count:
        syllables = "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(rng.randint(1, 3)))
        names.add(syllables + rng.choice(_CONSONANTS) + "us")
    return sorted(names, key=lambda _: rng.random())


def _distance(adjacency: dict[int, list[int]], source: int, target: int) -> int | None:
    seen, queue = {source: 0}, collections.deque([source])
    while queue:
        node = queue.popleft()
        if node == target:
            return seen[node]
        for nxt in adjacency[node]:
            if nxt not in seen:
                seen[nxt] = seen[node] + 1
                queue.append(nxt)
    return None


def make_prosqa_example(rng: random.Random, index: int, config: ProsQAConfig) -> dict:
    del index
    n = rng.randint(config.min_concepts, config.max_concepts)
    path_len = rng.randint(config.min_path, config.max_path)
    # Node 0 is the entity; concepts 1..n are in topological order.
    concepts = list(range(1, n + 1))
    proof = sorted(rng.sample(concepts, path_len))
    rest = [c for c in concepts if c not in set(proof)]
    decoy = sorted(rng.sample(rest, rng.randint(max(2, path_len // 2), path_len)))
    reachable = set(proof) | {0} | {c for c in rest if c not in set(decoy) and rng.random() < 0.5}

    edges: list[tuple[int, int]] = [(0, proof[0])] + list(zip(proof, proof[1:])) + list(zip(decoy, decoy[1:]))
    edge_set = set(edges)
    adjacency: dict[int, list[int]] = collections.defaultdict(list)
    for u, v in edges:
        adjacency[u].append(v)

    def try_add(u: int, v: int) -> bool:
        if u == 0 or (u, v) in edge_set or (u in reachable and v not in reachable):
            return False
        adjacency[u].append(v)
        if _distance(adjacency, 0, proof[-1]) < path_len:  # a shortcut would make the proof non-minimal
            adjacency[u].pop()
            return False
        edges.append((u, v))
        edge_set.add((u, v))
        return True

    touched = {x for e in edges for x in e}
    for c in rng.sample(concepts, n):  # give every concept a sentence (a bounded number of tries)
        for _ in range(100):
            if c in touched:
                break
            other = rng.choice([x for x in concepts if x != c])
            if try_add(min(c, other), max(c, other)):
                touched.update((c, other))
    for _ in range(int(config.extra_edges_per_concept * n)):
        u, v = sorted(rng.sample(concepts, 2))
        try_add(u, v)

    words = concept_names(rng, n)
    entity = rng.choice(NAMES)
    symbols = [entity] + words
    sentences = [f"Every {symbols[u]} is a {symbols[v]}." for u, v in edges[1:]]
    rng.shuffle(sentences)
    target, neg_target = proof[-1], decoy[-1]
    options = [symbols[target], symbols[neg_target]]
    rng.shuffle(options)
    membership = f"{entity} is a {symbols[proof[0]]}."
    prompt = " ".join(sentences + [membership, f"Is {entity} a {options[0]} or a {options[1]}?"])
    steps = [membership] + [f"Every {symbols[u]} is a {symbols[v]}." for u, v in zip(proof, proof[1:])]
    answer = f"{entity} is a {symbols[target]}."
    return {
        "prompt": prompt,
        "response": "\n".join(steps) + f"\n### {answer}",
        "steps": steps,
        "answer": answer,
        "idx_to_symbol": symbols,
        "edges": [list(e) for e in edges],
        "root": 0,
        "target": target,
        "neg_target": neg_target,
        "length": path_len,
    }
