"""A training workdir's logs read and checked: its runs (one, or one per sub-folder of a comparison), each
run's metrics.jsonl, final and best metrics, throughput, checkpoints and --mode=eval results. Bad input is
a ReportError naming the file and line."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any, NamedTuple

from t2mlr_jax.storage.workdir import METRICS, RUN_CONFIG, saved_steps

# Metrics with a direction get a "best" value; the others (lr, grad_norm, gates) only a final one.
LOWER_IS_BETTER = ("loss", "perplexity", "bpb")
HIGHER_IS_BETTER = ("accuracy", "token_accuracy", "exact_match")


class ReportError(ValueError):
    """The workdir cannot be reported on; the message says where and why."""


class RunLog(NamedTuple):
    name: str
    path: Path
    config: dict
    records: list[dict]


def is_gate_key(key: str) -> bool:
    return key.startswith("gate/") or "gamma" in key


def read_json(path: Path) -> Any:
    """The file's JSON value, or None when it does not exist."""
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ReportError(f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from None


def read_metrics(path: Path) -> list[dict]:
    records = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ReportError(f"{path} line {number}: not valid JSON ({e.msg})") from None
            if not (isinstance(record, dict) and isinstance(record.get("step"), int) and "split" in record):
                raise ReportError(f"{path} line {number}: not an object with an integer 'step' and a 'split'")
            records.append(record)
    return records


def metric_trajectory(workdir: Path, split: str, key: str) -> list[tuple[int, float]]:
    """(step, value) of one metric a run logged in `split` ("train", "eval") over training."""
    return [
        (m["step"], m[key]) for m in read_metrics(Path(workdir) / METRICS) if m["split"] == split and key in m
    ]


def run_folders(workdir: Path) -> list[Path]:
    if not workdir.is_dir():
        raise ReportError(f"{workdir} is not a directory")
    if (workdir / METRICS).is_file():
        return [workdir]
    runs = sorted(d for d in workdir.iterdir() if (d / METRICS).is_file())
    if not runs:
        raise ReportError(f"{workdir} has no {METRICS} and no sub-folder with one (not a main.py workdir?)")
    return runs


def load_runs(workdir: Path) -> list[RunLog]:
    runs = []
    for path in run_folders(workdir):
        config = read_json(path / RUN_CONFIG) or {}
        runs.append(RunLog(config.get("arch", path.name), path, config, read_metrics(path / METRICS)))
    return runs


def split_report(records: list[dict]) -> dict:
    """The last line of one split (its final metrics) and the best value of each metric with a direction."""
    if not records:
        return {}
    best = {}
    for key in LOWER_IS_BETTER + HIGHER_IS_BETTER:
        logged = [r for r in records if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
        if logged:
            pick = min if key in LOWER_IS_BETTER else max
            record = pick(logged, key=lambda r: r[key])
            best[key] = {"value": record[key], "step": record["step"]}
    final = {k: v for k, v in records[-1].items() if k not in ("split", "time")}
    return {"final": final, "best": best}


def throughput(train: list[dict]) -> dict:
    """Steps and tokens per second between consecutive timed train lines. The median, because one interval
    may span a restart (or a long eval / save) and should not skew the figure."""
    timed = [r for r in train if "time" in r]
    intervals = [
        (b["step"] - a["step"], b["time"] - a["time"], b.get("tokens"))  # tokens: per step, window mean
        for a, b in zip(timed, timed[1:])
        if b["step"] > a["step"] and b["time"] > a["time"]  # a resume may log a step again
    ]
    if not intervals:
        why = (
            "no `time` field in metrics.jsonl (a log written before it existed)"
            if not timed
            else "fewer than two timed train lines"
        )
        return {"steps_per_second": "unknown", "tokens_per_second": "unknown", "note": why}
    tokens_known = all(tokens is not None for _, _, tokens in intervals)
    return {
        "steps_per_second": statistics.median(steps / seconds for steps, seconds, _ in intervals),
        "tokens_per_second": (
            statistics.median(tokens * steps / seconds for steps, seconds, tokens in intervals)
            if tokens_known
            else "unknown"
        ),
        "note": f"median of {len(intervals)} intervals between train log lines; wall clock, evals included",
    }


def checkpoint_list(folder: Path) -> list[dict]:
    """The orbax step folders, oldest first, with their size on disk."""
    steps = saved_steps(folder)
    return [
        {
            "step": step,
            "bytes": sum(f.stat().st_size for f in (folder / str(step)).rglob("*") if f.is_file()),
            "latest": step == steps[-1],
        }
        for step in steps
    ]


def mode_eval_results(path: Path) -> list[dict]:
    """The eval_step<N>.json files of --mode=eval, by step."""
    steps = [f.stem.removeprefix("eval_step") for f in path.glob("eval_step*.json")]
    return [
        {"step": step, **read_json(path / f"eval_step{step}.json")}
        for step in sorted(int(s) for s in steps if s.isdigit())
    ]


def fmt(value: Any) -> str:
    """Numbers short, strings as they are, anything else as JSON (true, null, {}): the report's one format,
    its ending lines (run_ending.py) included."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return json.dumps(value)
    return f"{value:,}" if isinstance(value, int) else f"{value:.6g}"
