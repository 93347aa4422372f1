"""Metric sinks: a JSONL file and TensorBoard event files, written without TensorFlow.

An event file is a TFRecord stream (length, masked CRC32C of the length, payload, masked CRC32C of the
payload) of `tensorflow.Event` protos; a scalar is Event{wall_time=1, step=2, summary=5{value=1{tag=1,
simple_value=2}}}. The handful of protobuf fields needed are encoded here by hand.
"""

from __future__ import annotations

import json
import math
import socket
import struct
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from t2mlr_jax.parallel.multihost import is_lead_host
from t2mlr_jax.storage.workdir import METRICS

_CRC32C_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _CRC32C_TABLE.append(_c)


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        bits, n = n & 0x7F, n >> 7
        out.append(bits | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, wire_type: int, payload: bytes) -> bytes:
    return _varint(number << 3 | wire_type) + payload


def _length_delimited(number: int, payload: bytes) -> bytes:
    return _field(number, 2, _varint(len(payload)) + payload)


def event_bytes(
    step: int, wall_time: float, *, scalars: Mapping[str, float] = (), file_version: str = ""
) -> bytes:
    """One serialized Event: either the file-version header or a Summary of scalar values."""
    body = _field(1, 1, struct.pack("<d", wall_time)) + _field(2, 0, _varint(step))
    if file_version:
        return body + _length_delimited(3, file_version.encode())
    values = b"".join(
        _length_delimited(1, _length_delimited(1, tag.encode()) + _field(2, 5, struct.pack("<f", v)))
        for tag, v in scalars.items()
    )
    return body + _length_delimited(5, values)


def record_bytes(payload: bytes) -> bytes:
    length = struct.pack("<Q", len(payload))
    return (
        length
        + struct.pack("<I", masked_crc32c(length))
        + payload
        + struct.pack("<I", masked_crc32c(payload))
    )


class EventWriter:
    """Appends scalar events to a new events.out.tfevents.* file in `logdir` (TensorBoard reads it)."""

    def __init__(self, logdir: Path):
        logdir = Path(logdir)
        logdir.mkdir(parents=True, exist_ok=True)
        now = time.time()
        self.path = logdir / f"events.out.tfevents.{int(now)}.{socket.gethostname()}.{time.monotonic_ns()}"
        self._file = open(self.path, "ab")
        self._file.write(record_bytes(event_bytes(0, now, file_version="brain.Event:2")))

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        finite = {k: float(v) for k, v in values.items() if math.isfinite(float(v))}
        self._file.write(record_bytes(event_bytes(step, time.time(), scalars=finite)))
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def json_safe(value: Any) -> Any:
    """`value` with non-finite floats as the strings "nan", "inf", "-inf": strict JSON, still readable."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


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
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(kept))
    tmp.replace(path)


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
        self._events = EventWriter(workdir / "tensorboard")

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
        self._events.scalars(step, {f"{split}/{k}": v for k, v in scalars.items()})

    def close(self) -> None:
        if self.active:
            self._jsonl.close()
            self._events.close()

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
