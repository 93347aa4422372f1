"""Shortest-path finding on a DAG with dead ends (the release's pathfinding generator, re-derived).

A backbone path start -> ... -> end of `path_length` edges is the unique shortest path: every parallel
lane leaves the backbone in its first half and rejoins it in its second half with at least one extra
node, so it is strictly longer; dead-end spurs never reach `end`. The prompt lists the shuffled edges;
the response is the path "a -> b -> ... -> z".
"""

from __future__ import annotations

import dataclasses
import random

_SYLLABLES = [c + v for c in "bcdfglmnprstvz" for v in "aeiou"]
_SUFFIXES = "xnrstlmv"


@dataclasses.dataclass(frozen=True)
class PathfindingConfig:
    min_path_length: int = 10
    max_path_length: int = 18
    num_lanes: int = 6
    min_lane_extra: int = 1
    max_lane_extra: int = 3
    dead_end_prob: float = 0.2
    dead_end_depth: int = 2
    wait_prefix: bool = False  # the release's --add_wait_tokens: response starts with "Wait "

    def __post_init__(self):
        if not 3 <= self.min_path_length <= self.max_path_length:
            raise ValueError("need 3 <= min_path_length <= max_path_length")
        if not 1 <= self.min_lane_extra <= self.max_lane_extra:
            raise ValueError("need 1 <= min_lane_extra <= max_lane_extra (lanes must be strictly longer)")
        if self.dead_end_depth < 1 or not 0.0 <= self.dead_end_prob <= 1.0:
            raise ValueError("need dead_end_depth >= 1 and 0 <= dead_end_prob <= 1")


def node_names(rng: random.Random, count: int) -> list[str]:
    names: set[str] = set()
    while len(names) < count:
        syllables = 2 if rng.random() < 0.7 else 3
        names.add("".join(rng.choice(_SYLLABLES) for _ in range(syllables)) + rng.choice(_SUFFIXES))
    return sorted(names, key=lambda _: rng.random())


def make_pathfinding_example(rng: random.Random, index: int, config: PathfindingConfig) -> dict:
    del index
    length = rng.randint(config.min_path_length, config.max_path_length)
    edges = [(i, i + 1) for i in range(length)]  # the backbone 0 -> 1 -> ... -> length
    next_node = length + 1
    for _ in range(config.num_lanes):
        branch = rng.randint(0, length // 2)
        merge = rng.randint(length // 2 + 1, length - 1)
        lane_length = merge - branch + rng.randint(config.min_lane_extra, config.max_lane_extra)
        lane = list(range(next_node, next_node + lane_length))
        next_node += len(lane)
        hops = [branch] + lane + [merge]
        edges += list(zip(hops, hops[1:]))
    for source in range(next_node):
        if source != length and rng.random() < config.dead_end_prob:
            spur = [source] + list(range(next_node, next_node + config.dead_end_depth))
            next_node += config.dead_end_depth
            edges += list(zip(spur, spur[1:]))

    names = node_names(rng, next_node)
    shuffled = list(edges)
    rng.shuffle(shuffled)
    prompt = (
        "Find the shortest path in this directed graph.\n"
        f"Start: {names[0]}\nEnd: {names[length]}\nEdges:\n"
        + "\n".join(f"{names[u]} -> {names[v]}" for u, v in shuffled)
        + "\nAnswer: "
    )
    answer = " -> ".join(names[: length + 1])
    return {
        "prompt": prompt,
        "response": ("Wait " if config.wait_prefix else "") + answer,
        "answer": answer,
        "idx_to_symbol": names,
        "edges": [list(e) for e in shuffled],
        "start": 0,
        "end": length,
        "path_length": length,
        "length": length,
    }
