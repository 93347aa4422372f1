"""The tiny T²MLR run every fault case starts from: 9 steps, a checkpoint every step (6 kept), a log line
every 3 (so a resume can fall inside a logging window), and an iterator that signals its own process; and
the tiny LRT run with every stateful part (MoE routing biases, P sampled per step, Muon)."""

import json
import os
import time
from pathlib import Path

import jax
import numpy as np

from t2mlr_jax.experiment import resolve
from t2mlr_jax.train.trainer import Run, restore_state, train
from tests.tiny import tiny_experiment, tiny_lrt_experiment
from tests.train.tiny_task import SEQ_LEN, TinyIterator, tiny_source

STEPS = 9


def config(**train_fields):
    fields = {"checkpoint_every": 1, "keep_checkpoints": 6, "log_every": 3, **train_fields}
    return tiny_experiment("t2mlr", steps=STEPS, **fields)


class SignallingIterator(TinyIterator):
    """Sends `signum` to its own process when asked for batch `at`: SIGKILL dies before step `at` runs,
    SIGTERM (a preemption) lets step `at` finish, save and stop."""

    def __init__(self, at: int, signum: int, *args):
        super().__init__(*args)
        self.at, self.signum = at, signum

    def __next__(self):
        if self.index + 1 == self.at:
            os.kill(os.getpid(), self.signum)
        return super().__next__()


def signalling_source(at: int, signum: int):
    return tiny_source()._replace(train_iterator=lambda: SignallingIterator(at, signum, 0, 8, SEQ_LEN))


class PausingIterator(TinyIterator):
    """Asked for batch `at`, creates the file `paused` and waits until the file `go` exists: a session
    held mid-run, for a second one to meet."""

    def __init__(self, at: int, paused: Path, go: Path, *args):
        super().__init__(*args)
        self.at, self.paused, self.go = at, paused, go

    def __next__(self):
        if self.index + 1 == self.at:
            self.paused.touch()
            while not self.go.exists():
                time.sleep(0.05)
        return super().__next__()


def pausing_source(at: int, paused: Path, go: Path):
    return tiny_source()._replace(train_iterator=lambda: PausingIterator(at, paused, go, 0, 8, SEQ_LEN))


def lrt_config():
    """P sampled from {1, 2}: each distinct P compiles its own step, and P = 3, 4 would only be slower."""
    config = tiny_lrt_experiment(steps=STEPS, checkpoint_every=2)
    config.lrt.passes, config.lrt.pass_probs = (1, 2), (0.5, 0.5)
    return config


def run(workdir, cfg=None, source=None, arch="t2mlr") -> Run:
    cfg = cfg or (lrt_config() if arch == "lrt" else config())
    return Run(resolve(cfg), workdir, source or tiny_source(), arch)


def train_tiny(workdir, cfg=None, source=None) -> dict:
    return train(run(workdir, cfg, source))


def final_state(workdir, cfg=None):
    state, step = restore_state(run(workdir, cfg))
    assert step == STEPS
    return state


def assert_same_state(a, b) -> None:
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def records(workdir) -> list[dict]:
    """metrics.jsonl without the wall-clock times."""
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k != "time"} for line in lines]
