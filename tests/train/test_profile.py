"""train.profile: a jax.profiler trace of exactly the window's steps, read back by the profiler's own reader,
whose slowest ops tools/report.py names; a malformed window is refused when the config is read."""

import gzip
import json

import pytest
from jax.profiler import ProfileData

from t2mlr_jax.analysis.profile_ops import newest_trace, slowest_ops
from t2mlr_jax.analysis.report import build_report, text_summary
from t2mlr_jax.analysis.run_logs import load_runs
from t2mlr_jax.experiment import resolve
from t2mlr_jax.storage.workdir import PROFILE
from t2mlr_jax.train.trainer import Run, train
from tests.faults.tiny_run import config
from tests.tiny import tiny_experiment
from tests.train.tiny_task import tiny_source


def _traced_steps(trace) -> list[int]:
    return sorted(
        int(dict(event.stats)["step_num"])
        for plane in ProfileData.from_file(str(trace)).planes
        for line in plane.lines
        for event in line.events
        if event.name == "train" and "step_num" in dict(event.stats)
    )


def test_the_window_traces_its_steps_and_the_report_names_the_slowest_ops(tmp_path):
    cfg = tiny_experiment("transformer", steps=6, profile="4:6", checkpoint_every=6, log_every=3)
    train(Run(resolve(cfg), tmp_path, tiny_source(), "transformer"))
    trace = newest_trace(tmp_path / PROFILE)
    assert trace is not None and _traced_steps(trace) == [4, 5]
    with gzip.open(next(trace.parent.glob("perfetto_trace.json.gz"))) as f:
        assert json.load(f)["traceEvents"]  # what ui.perfetto.dev opens
    ops = slowest_ops(trace)
    assert ops["ops"] and ops["op_seconds"] > 0
    assert all(o["module"].startswith("jit_") and o["calls"] >= 1 for o in ops["ops"])
    assert [o["seconds"] for o in ops["ops"]] == sorted((o["seconds"] for o in ops["ops"]), reverse=True)
    report = build_report(tmp_path, load_runs(tmp_path))
    assert report["runs"][0]["profile"]["ops"][0]["op"] == ops["ops"][0]["op"]
    assert "slowest ops of the profiled steps" in text_summary(report)


@pytest.mark.parametrize(
    ("window", "error"),
    [
        ("3", "must be START:STOP"),
        ("0:2", "must be START:STOP"),
        ("5:5", "must be START:STOP"),
        ("a:b", "must be START:STOP"),
        ("4:20", "ends past train.steps"),
    ],
)
def test_a_bad_window_is_refused_with_the_setting_named(window, error):
    with pytest.raises(ValueError, match=f"^train.profile.*{error}"):
        resolve(config(profile=window))
