import collections
import re

from t2mlr_jax.data.answers import prosqa_path_correct
from t2mlr_jax.data.tasks import GeneratedTaskSource
from tests.data.graphs import bfs


def parse(prompt: str):
    edges = collections.defaultdict(set)
    for u, v in re.findall(r"Every (\w+) is a (\w+)\.", prompt):
        edges[u].add(v)
    entity, root = re.search(r"(\w+) is a (\w+)\.\s+Is", prompt).groups()
    edges[entity].add(root)
    a, b = re.search(r"Is \w+ a (\w+) or a (\w+)\?$", prompt).groups()
    return edges, entity, (a, b)


def test_proof_is_a_shortest_path_to_the_only_reachable_option():
    source = GeneratedTaskSource("prosqa", "train", seed=0, num_examples=12)
    sizes, lengths = [], []
    for i in range(12):
        record = source[i]
        edges, entity, options = parse(record["prompt"])
        dist, _ = bfs(edges, entity)
        answer = record["answer"].split(" is a ")[1].rstrip(".")
        wrong = next(o for o in options if o != answer)
        assert answer in options and answer in dist and wrong not in dist
        steps = [re.match(r"(?:Every )?(\w+) is a (\w+)\.", s).groups() for s in record["steps"]]
        assert steps[0][0] == entity and steps[-1][1] == answer
        assert all(v in edges[u] for u, v in steps) and all(a[1] == b[0] for a, b in zip(steps, steps[1:]))
        assert len(steps) == dist[answer] == record["length"]
        assert record["response"].endswith(f"\n### {record['answer']}")
        sizes.append(len(record["idx_to_symbol"]) - 1)
        lengths.append(record["length"])
    assert 50 <= min(sizes) and max(sizes) <= 70 and 6 <= min(lengths) and max(lengths) <= 10


def test_path_checker_accepts_the_gold_proof_and_rejects_broken_ones():
    record = GeneratedTaskSource("prosqa", "test", seed=1, num_examples=1)[0]
    assert prosqa_path_correct(record["response"] + "<|im_end|>", record)
    steps = record["steps"]
    assert not prosqa_path_correct("\n".join(steps[:1] + steps[2:]) + f"\n### {record['answer']}", record)
    wrong = record["answer"].replace(record["answer"].split(" is a ")[1], "zzzus.")
    assert not prosqa_path_correct("\n".join(steps) + f"\n### {wrong}", record)
