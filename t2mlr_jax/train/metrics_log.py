"""Metric sinks: a JSONL file and TensorBoard event files (tensorboardX: no TensorFlow)."""

from __future__ import annotations

import functools
import json
import math
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from t2mlr_jax.parallel.multihost import is_lead_host
from t2mlr_jax.storage.workdir import METRICS, write_atomic


def json_safe(value: Any) -> Any:
    """`value` with non-finite floats as the strings "nan", "inf", "-inf": strict JSON, still readable."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


@functools.cache
def _tensorboardx() -> tuple[type, type, type]:
    """(EventsWriter, Event, Summary). tensorboardX's package imports torch where it is installed, only to
    name torch.Tensor in type hints: 1.4 s of a run's first write here. A torch not yet imported is kept out
    while it loads (importing a `None` in sys.modules fails), and a later import gets the real one."""
    blocked = "torch" not in sys.modules
    if blocked:
        sys.modules["torch"] = None
    try:
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.proto.summary_pb2 import Summary
    finally:
        if blocked:
            del sys.modules["torch"]
    return EventsWriter, Event, Summary


def _truncate(path: Path, last_step: int) -> None:
    """Keep the records of steps <= last_step (and no torn last line): a resumed run logs the steps after
    its checkpoint again, and they must not appear twice."""
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if record.get("step", 0) <= last_step:
            kept.append(line + "\n")
    write_atomic(path, "".join(kept))


class MetricsLog:
    """One JSONL line per call ({"step", "split", "time", **metrics}) plus the same scalars in TensorBoard.
    `time` is the wall clock at writing (seconds since the epoch), so throughput can be read from the log
    alone (tools/report.py); logs written before it existed lack it. `resume_step`: the step training
    restarts from; later records of an earlier session are dropped. Only the lead host writes; on the
    others every call is a no-op."""

    def __init__(self, workdir: Path, resume_step: int | None = None):
        self.active = is_lead_host()
        if not self.active:
            return
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        self.jsonl_path = workdir / METRICS
        if resume_step is not None and self.jsonl_path.exists():
            _truncate(self.jsonl_path, resume_step)
        self._jsonl = open(self.jsonl_path, "a")
        self._tensorboard = workdir / "tensorboard"
        self._tensorboard.mkdir(exist_ok=True)
        self._events = None  # opened at the first write

    def _event_writer(self):
        events_writer, _, _ = _tensorboardx()
        # A new event file per session, so a resumed run keeps the earlier ones. tensorboardX names it by
        # the second and opens it for writing: the suffix keeps two sessions of one second apart.
        return events_writer(str(self._tensorboard / "events"), f".{time.monotonic_ns()}")

    def write(self, step: int, split: str, metrics: Mapping[str, Any]) -> None:
        if not self.active:
            return
        scalars = {
            k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) or hasattr(v, "item")
        }
        record = {
            "step": int(step),
            "split": split,
            "time": round(time.time(), 3),
            **scalars,
            **{k: v for k, v in metrics.items() if k not in scalars},
        }
        self._jsonl.write(json.dumps(json_safe(record)) + "\n")
        self._jsonl.flush()
        # Finite values only (metrics.jsonl keeps the rest). EventsWriter writes and fsyncs here, unlike
        # SummaryWriter's background queue: a killed run keeps every call.
        _, Event, Summary = _tensorboardx()
        self._events = self._events or self._event_writer()
        values = [
            Summary.Value(tag=f"{split}/{k}", simple_value=v) for k, v in scalars.items() if math.isfinite(v)
        ]
        self._events.write_event(Event(wall_time=time.time(), step=int(step), summary=Summary(value=values)))
        self._events.flush()

    def close(self) -> None:
        if self.active:
            self._jsonl.close()
            if self._events is not None:
                self._events.close()

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
