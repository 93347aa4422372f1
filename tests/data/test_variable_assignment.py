import pytest

from t2mlr_jax.data.tasks import GeneratedTaskSource
from t2mlr_jax.data.variable_assignment import HEADER, VariableAssignmentConfig


def resolve(prompt: str) -> tuple[str, int]:
    """Follow the assignments in the prompt text from the query to a number; return (value, hops)."""
    body = prompt[len(HEADER) :].split("\n")
    query = next(line for line in body if line.endswith("=___"))[:-4]
    assignments = dict(line.split("=") for line in body if "=" in line and not line.endswith("___"))
    hops, current = 0, query
    while not assignments[current].isdigit():
        current = assignments[current]
        hops += 1
    return assignments[current], hops


@pytest.mark.parametrize("depth", [0, 2, 5])
def test_response_is_the_resolved_value(depth):
    source = GeneratedTaskSource("variable_assignment", "train", seed=0, num_examples=20, depth=depth)
    for i in range(20):
        record = source[i]
        value, hops = resolve(record["prompt"])
        assert record["response"] == value
        assert hops == depth + 1  # the release's chain: depth + 1 alias hops
        assert record["prompt"].endswith("=___\nAnswer: | ")
        lines = record["prompt"][len(HEADER) :].split("\n")[:-2]
        assert len(lines) == 8 + depth + 1 + 6 and len({line.split("=")[0] for line in lines}) == len(lines)


def test_deterministic_and_validated():
    a = GeneratedTaskSource("variable_assignment", "test", seed=4, num_examples=3)
    assert a[2] == GeneratedTaskSource("variable_assignment", "test", seed=4, num_examples=3)[2]
    with pytest.raises(ValueError, match="<= 26"):
        VariableAssignmentConfig(depth=20)
