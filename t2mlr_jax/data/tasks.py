"""The generated tasks: a registry, and a grain RandomAccessDataSource producing their records on the fly.

Record i of (task, split, seed) is drawn from its own RNG seeded by that tuple, so records are
deterministic, independent of each other and of the order they are read in (any worker may produce
any index).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping
from typing import Any

from t2mlr_jax.data.pathfinding import PathfindingConfig, make_pathfinding_example
from t2mlr_jax.data.prosqa import ProsQAConfig, make_prosqa_example
from t2mlr_jax.data.s5_retrieval import SPLIT_DEFAULTS, S5RetrievalConfig, make_s5_retrieval_example
from t2mlr_jax.data.variable_assignment import VariableAssignmentConfig, make_variable_assignment_example
from t2mlr_jax.registry import did_you_mean

SPLITS = ("train", "validation", "test")


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    make_record: Callable[[random.Random, int, Any], dict]
    config_cls: type
    format: str  # how records become examples: "s5_retrieval" or "prompt_response"
    split_defaults: dict[str, dict] = dataclasses.field(default_factory=dict)  # per-split config fields

    def fields(self, split: str, options: Mapping[str, Any]) -> dict:
        """The generator's settings for a split: its split defaults, then `options`."""
        return {**self.split_defaults.get(split, {}), **options}


TASKS: dict[str, TaskSpec] = {
    "s5_retrieval": TaskSpec(make_s5_retrieval_example, S5RetrievalConfig, "s5_retrieval", SPLIT_DEFAULTS),
    "variable_assignment": TaskSpec(
        make_variable_assignment_example, VariableAssignmentConfig, "prompt_response"
    ),
    "prosqa": TaskSpec(make_prosqa_example, ProsQAConfig, "prompt_response"),
    "pathfinding": TaskSpec(make_pathfinding_example, PathfindingConfig, "prompt_response"),
}


def task_spec(task: str) -> TaskSpec:
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; expected one of {sorted(TASKS)}{did_you_mean(task, TASKS)}")
    return TASKS[task]


def task_config(spec: TaskSpec, task: str, split: str, options: Mapping[str, Any]) -> Any:
    """The task's generator settings for a split (TaskSpec.fields): an unknown option is one error naming
    the closest fields."""
    names = [f.name for f in dataclasses.fields(spec.config_cls)]
    for key in options:
        if key not in names:
            raise ValueError(
                f"bad option for task {task!r}: {key!r} is not one of its fields{did_you_mean(key, names)}; "
                f"known: {names}"
            )
    return spec.config_cls(**spec.fields(split, options))


class GeneratedTaskSource:
    """grain RandomAccessDataSource: index -> JSON-serialisable record of a generated task.

    `config` overrides fields of the task's config dataclass (e.g. value_key="action" for S5).
    """

    def __init__(self, task: str, split: str, *, seed: int, num_examples: int, **config):
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
        if num_examples < 1:
            raise ValueError(f"num_examples must be >= 1, got {num_examples}")
        self.task, self.split, self.seed, self.num_examples = task, split, seed, num_examples
        self.spec = task_spec(task)
        self.config = task_config(self.spec, task, split, config)

    def __len__(self) -> int:
        return self.num_examples

    def __getitem__(self, index: int) -> dict:
        if not 0 <= index < self.num_examples:
            raise IndexError(f"record {index} out of range [0, {self.num_examples})")
        rng = random.Random(f"{self.task}/{self.split}/{self.seed}/{index}")
        return self.spec.make_record(rng, index, self.config)

    def __repr__(self) -> str:
        return f"GeneratedTaskSource({self.task!r}, {self.split!r}, seed={self.seed}, n={self.num_examples})"
