import json
import subprocess
import sys

import pytest
from tbparse import SummaryReader

from t2mlr_jax.train.metrics_log import MetricsLog

# tbparse 0.0.9 sorts with pandas' deprecated inplace=True; not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:The inplace keyword")


def _scalars(workdir) -> dict:
    """{(step, tag): value} of every event file under workdir/tensorboard, as TensorBoard reads them."""
    frame = SummaryReader(str(workdir / "tensorboard")).scalars
    return {(int(s), t): v for s, t, v in zip(frame.step, frame.tag, frame.value, strict=True)}


def test_jsonl_and_tensorboard_events_hold_the_same_scalars(tmp_path):
    log = MetricsLog(tmp_path)
    log.write(7, "train", {"loss": 1.25, "lr": 3e-4})
    log.write(8, "eval", {"loss": 2.0, "grad_norm": float("nan"), "by_length": {1: {"exact_match": 1.0}}})
    # Flushed at each call: a run killed before close keeps what it logged.
    assert _scalars(tmp_path) == {
        (7, "train/loss"): 1.25,
        (7, "train/lr"): pytest.approx(3e-4),
        (8, "eval/loss"): 2.0,
    }
    log.close()
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert isinstance(lines[0].pop("time"), float)  # wall clock, for throughput (tools/report.py)
    assert lines[0] == {"step": 7, "split": "train", "loss": 1.25, "lr": 3e-4}
    assert lines[1]["grad_norm"] == "nan"  # non-finite: in the JSONL only
    assert lines[1]["by_length"] == {"1": {"exact_match": 1.0}}


def test_a_resumed_session_adds_an_event_file_and_keeps_the_earlier_one(tmp_path):
    with MetricsLog(tmp_path) as log:
        log.write(1, "train", {"loss": 3.0})
        log.write(2, "train", {"loss": 2.0})
    with MetricsLog(tmp_path, resume_step=1) as log:
        log.write(2, "train", {"loss": 2.5})
    assert len(list((tmp_path / "tensorboard").iterdir())) == 2
    frame = SummaryReader(str(tmp_path / "tensorboard")).scalars
    assert sorted(zip(frame.step, frame.value, strict=True)) == [(1, 3.0), (2, 2.0), (2, 2.5)]
    steps = [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]  # the JSONL is the record: steps after the checkpoint are not repeated


def test_writing_events_does_not_import_torch(tmp_path):
    """tensorboardX's package would import torch (installed here) for its type hints: 1.4 s of every run.
    A fresh interpreter writes its events without it, and can still import torch afterwards."""
    script = (
        "import sys; from pathlib import Path; from t2mlr_jax.train.metrics_log import MetricsLog\n"
        f"log = MetricsLog(Path({str(tmp_path)!r})); log.write(1, 'train', {{'loss': 2.0}}); log.close()\n"
        "print('torch' in sys.modules)\n"
        "import torch; print(torch.ones(1).item())\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "1.0"]
    assert _scalars(tmp_path) == {(1, "train/loss"): 2.0}
