import json
import struct

import pytest

from t2mlr_jax.train.metrics_log import MetricsLog, crc32c, masked_crc32c


def test_crc32c_known_vectors():
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    assert crc32c(b"") == 0


def _varint(data, i):
    shift = value = 0
    while True:
        byte = data[i]
        value |= (byte & 0x7F) << shift
        i += 1
        if not byte & 0x80:
            return value, i
        shift += 7


def _fields(data):
    """(field number, value) pairs of a protobuf message (wire types 0, 1, 2, 5)."""
    i, out = 0, []
    while i < len(data):
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(data, i)
        elif wire == 1:
            value, i = struct.unpack("<d", data[i : i + 8])[0], i + 8
        elif wire == 5:
            value, i = struct.unpack("<f", data[i : i + 4])[0], i + 4
        else:
            n, i = _varint(data, i)
            value, i = data[i : i + n], i + n
        out.append((number, value))
    return out


def _records(raw):
    i = 0
    while i < len(raw):
        (n,) = struct.unpack("<Q", raw[i : i + 8])
        assert struct.unpack("<I", raw[i + 8 : i + 12])[0] == masked_crc32c(raw[i : i + 8])
        payload = raw[i + 12 : i + 12 + n]
        assert struct.unpack("<I", raw[i + 12 + n : i + 16 + n])[0] == masked_crc32c(payload)
        yield payload
        i += 16 + n


def test_jsonl_and_tensorboard_events_hold_the_same_scalars(tmp_path):
    log = MetricsLog(tmp_path)
    log.write(7, "train", {"loss": 1.25, "lr": 3e-4})
    log.write(8, "eval", {"loss": 2.0, "by_length": {1: {"exact_match": 1.0}}})
    log.close()
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert isinstance(lines[0].pop("time"), float)  # wall clock, for throughput (tools/report.py)
    assert lines[0] == {"step": 7, "split": "train", "loss": 1.25, "lr": 3e-4}
    assert lines[1]["by_length"] == {"1": {"exact_match": 1.0}}
    (events,) = (tmp_path / "tensorboard").iterdir()
    records = list(_records(events.read_bytes()))
    assert dict(_fields(records[0]))[3] == b"brain.Event:2"
    scalars = {}
    for record in records[1:]:
        event = dict(_fields(record))
        for _number, value in _fields(event[5]):
            tag_value = dict(_fields(value))
            scalars[(event[2], tag_value[1].decode())] = tag_value[2]
    assert scalars == {(7, "train/loss"): 1.25, (7, "train/lr"): pytest.approx(3e-4), (8, "eval/loss"): 2.0}
