import pytest

from t2mlr_jax.data.tasks import TASKS, GeneratedTaskSource


@pytest.mark.parametrize("task", sorted(TASKS))
def test_every_task_is_an_iterable_random_access_source(task):
    source = GeneratedTaskSource(task, "validation", seed=0, num_examples=3)
    records = list(source)  # plain Python iteration
    assert len(records) == 3 and records[1] == source[1]
    assert all(isinstance(r, dict) for r in records)
    with pytest.raises(IndexError):
        source[3]


def test_bad_task_arguments_raise():
    with pytest.raises(ValueError, match="unknown split"):
        GeneratedTaskSource("prosqa", "dev", seed=0, num_examples=1)
    with pytest.raises(ValueError, match="num_examples"):
        GeneratedTaskSource("prosqa", "train", seed=0, num_examples=0)
    with pytest.raises(ValueError, match="bad option for task 'pathfinding'"):
        GeneratedTaskSource("pathfinding", "train", seed=0, num_examples=1, colour="red")
