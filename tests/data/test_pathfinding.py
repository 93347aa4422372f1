import collections

from t2mlr_jax.data.answers import pathfinding_path_correct
from t2mlr_jax.data.tasks import GeneratedTaskSource
from tests.data.graphs import bfs


def test_answer_is_the_unique_shortest_path_of_the_prompt_graph():
    source = GeneratedTaskSource("pathfinding", "train", seed=0, num_examples=10)
    for i in range(10):
        record = source[i]
        lines = record["prompt"].split("\n")
        start, end = lines[1].removeprefix("Start: "), lines[2].removeprefix("End: ")
        edges = collections.defaultdict(list)
        for line in lines[4:-1]:
            u, v = line.split(" -> ")
            edges[u].append(v)
        path = record["response"].split(" -> ")
        assert path[0] == start and path[-1] == end
        assert all(v in edges[u] for u, v in zip(path, path[1:]))
        dist, count = bfs(edges, start)
        assert (dist[end], count[end]) == (len(path) - 1, 1)  # the unique shortest path
        assert 10 <= record["path_length"] == len(path) - 1 <= 18
        assert pathfinding_path_correct(record["response"], record)
        assert not pathfinding_path_correct(" -> ".join(path[:-2] + path[-1:]), record)


def test_wait_prefix_option():
    record = GeneratedTaskSource("pathfinding", "train", seed=0, num_examples=1, wait_prefix=True)[0]
    assert record["response"] == "Wait " + record["answer"]
    assert pathfinding_path_correct(record["response"], record)
