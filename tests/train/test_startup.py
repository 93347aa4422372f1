"""Start-up: the train step is traced and compiled before the input pipeline starts, so no data thread
competes with tracing (16 of grain's once stretched a 4-layer model's tracing to a minute), on a fresh
and on a resumed run; the lead host writes the phases of the time to the first step to startup.json; a
batch of other shapes than the step was compiled for is one clear error."""

import json

import pytest

from t2mlr_jax.experiment import resolve
from t2mlr_jax.train import startup
from t2mlr_jax.train.trainer import Run, train
from tests.tiny import tiny_experiment
from tests.train.tiny_task import SEQ_LEN, TinyIterator, tiny_source

TRAINER_PHASES = ["state", "trace", "compile", "data", "first_step"]


@pytest.mark.slow
def test_the_step_is_compiled_before_the_pipeline_starts_fresh_and_resumed(tmp_path, monkeypatch):
    events = []
    mark = startup.mark
    monkeypatch.setattr(startup, "mark", lambda phase: (events.append(phase), mark(phase)))

    def pipeline():
        events.append("pipeline")
        return TinyIterator(0, 8, SEQ_LEN)

    source = tiny_source()._replace(train_iterator=pipeline)
    for steps in (2, 4):  # the second session resumes from step 2
        events.clear()
        train(Run(resolve(tiny_experiment(steps=steps)), tmp_path, source, "t2mlr"))
        assert events == ["state", "trace", "compile", "pipeline", "data", "first_step"]
        record = json.loads((tmp_path / startup.STARTUP).read_text())
        assert [p for p in record["phases"] if p in TRAINER_PHASES] == TRAINER_PHASES
        assert all(seconds >= 0 for seconds in record["phases"].values())
        assert record["step"] == steps - 1  # the session's first step
        assert record["seconds"] == pytest.approx(sum(record["phases"].values()), abs=1e-2)


@pytest.mark.slow
def test_batches_of_other_shapes_than_compiled_are_one_clear_error(tmp_path):
    source = tiny_source(seq_len=SEQ_LEN * 2)
    with pytest.raises(ValueError, match=r"compiled for .*\(train.batch_size x data.seq_len\)"):
        train(Run(resolve(tiny_experiment(steps=2)), tmp_path, source, "t2mlr"))
