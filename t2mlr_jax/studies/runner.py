"""The one study runner: a study is a table of units, (row, seed) pairs (rows × seeds, `grid`), with what
one unit runs; `run` runs them in order under one progress bar, appends a JSONL line per unit computed now,
and stops at a unit a signal stopped (a rerun resumes); `judge` judges a study's claims with the protocol's
paired intervals (protocol.compare); `run_shards` spreads the units over worker processes, each the study's
own command with --shard=I/N.

A unit is resumed by whichever keeps it: a run function that reads a finished unit back from its own
workdir returns `Ran(metrics, fresh=False)` (nothing journaled again); a plain dict is the runner's to
resume (with `resume`, a unit whose line is already in the journal is read back from it, not run)."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from tqdm import tqdm

from t2mlr_jax.studies.protocol import Claim, compare

Unit = tuple[Hashable, int]  # (row, seed)


class Ran(NamedTuple):
    """A unit's metrics, and whether anything was computed now (journaled) rather than read back."""

    metrics: dict
    fresh: bool = True


def unit_line(row: Hashable, seed: int, seconds: float, metrics: dict) -> dict:
    """The journal's line of a unit: its row, seed and wall seconds, then its metrics."""
    return {"row": row, "seed": seed, "seconds": seconds, **metrics}


@dataclasses.dataclass(frozen=True)
class Study:
    units: Sequence[Unit]  # in running order
    run: Callable[[Hashable, int], dict | Ran]  # a unit's metrics; with "stopped_by" when a signal stopped it
    journal: Path | None = None  # the results JSONL, a line per unit computed now
    line: Callable[[Hashable, int, float, dict], dict] = unit_line
    resume: bool = False  # units whose line is in the journal are read back from it, not run
    tag: Callable[[Hashable, int], str] = lambda row, seed: str(row)  # names a stopped unit
    report: Callable[[Hashable, int, dict, float], str] | None = None  # a line written after each unit
    desc: str = "rows x seeds"

    @property
    def rows(self) -> list:
        return list(dict.fromkeys(row for row, _ in self.units))


class Outcome(NamedTuple):
    results: dict  # row -> seed -> metrics, every row of the study (in order) a key
    seconds: dict  # (row, seed) -> wall seconds of the units this call ran or read back
    stopped: bool  # a signal stopped a unit: the results hold the units before it


def grid(rows: Sequence, seeds: Sequence[int], seed_major: bool = False) -> list[Unit]:
    """rows × seeds, row by row (or, `seed_major`, one seed of every row first)."""
    if seed_major:
        return [(row, seed) for seed in seeds for row in rows]
    return [(row, seed) for row in rows for seed in seeds]


def journaled(study: Study) -> dict[Unit, dict]:
    """The units already in the study's journal (lines of `unit_line`'s form): (row, seed) -> the line's
    metrics (the last line wins)."""
    if study.journal is None or not study.journal.exists():
        return {}
    lines = [json.loads(text) for text in study.journal.read_text().splitlines() if text.strip()]
    return {
        (x["row"], x["seed"]): {k: v for k, v in x.items() if k not in unit_line(0, 0, 0, {})} for x in lines
    }


def run(study: Study) -> Outcome:
    """Every unit of `study` in order (see the module's docstring for what is resumed how)."""
    results = {row: {} for row in study.rows}
    seconds = {}
    done = journaled(study) if study.resume else {}
    for row, seed in tqdm(study.units, desc=study.desc, file=sys.stderr):
        started = time.time()
        if (row, seed) in done:
            ran = Ran(done[row, seed], fresh=False)
        else:
            ran = study.run(row, seed)
            ran = ran if isinstance(ran, Ran) else Ran(ran)
        if "stopped_by" in ran.metrics:
            tag = study.tag(row, seed)
            tqdm.write(
                (f"{tag}: " if tag else "")
                + f"stopped by {ran.metrics['stopped_by']} at step {ran.metrics['step']}; rerun to resume"
            )
            return Outcome(results, seconds, True)
        seconds[row, seed] = round(time.time() - started, 1)
        if ran.fresh and study.journal is not None:
            with open(study.journal, "a") as f:
                line = study.line(row, seed, seconds[row, seed], ran.metrics)
                f.write(json.dumps(line, default=str) + "\n")
        results[row][seed] = ran.metrics
        if study.report:
            tqdm.write(study.report(row, seed, ran.metrics, seconds[row, seed]))
    return Outcome(results, seconds, False)


def values(results: Mapping, metric: Callable[[dict], float]) -> dict:
    """row -> seed -> the unit's `metric`, as protocol.compare takes them."""
    return {row: {seed: metric(r) for seed, r in by_seed.items()} for row, by_seed in results.items()}


def judge(
    values: Mapping[str, Mapping[int, float]],
    claims: Sequence[Claim],
    refused_runs: Callable[[str], list[str]] = lambda row: [],
    claimed_only: bool = False,
) -> dict:
    """protocol.compare of the rows' `values` on the claims. A claim one of whose rows `refused_runs` names
    (trained under another recipe than the pre-registered one) is listed under "refused" with why instead
    of judged; `claimed_only`: the comparison's rows are those of the judged claims only."""
    refused = {}
    for c in claims:
        why = [w for name in (c.row, c.baseline) for w in refused_runs(name)]
        if why:
            refused[f"{c.row} vs {c.baseline}"] = why
    claims = [c for c in claims if f"{c.row} vs {c.baseline}" not in refused]
    if claimed_only:
        values = {name: values[name] for c in claims for name in (c.row, c.baseline)}
    return compare(values, claims) | ({"refused": refused} if refused else {})


def run_shards(module: str, argv: list[str], workers: int, out: Path, workdirs: list[Path], extra=()) -> bool:
    """`python -m module *argv --shard=I/N *extra` for each of `workers` shards side by side
    (t2mlr_jax.train.local_workers), their logs in `out`; a failed worker is one error line. Whether every
    worker finished (False: a signal stopped them; a rerun resumes)."""
    from t2mlr_jax.config.cli import fail
    from t2mlr_jax.studies import ROOT
    from t2mlr_jax.train.local_workers import WorkerFailed, run_workers, with_pythonpath

    shard = lambda i: [sys.executable, "-m", module, *argv, f"--shard={i}/{workers}", *extra]
    commands = [shard(i) for i in range(workers)]
    try:
        return run_workers(commands, out, workdirs, env=with_pythonpath(ROOT))
    except WorkerFailed as e:
        fail(e)


def write_json(path: Path, payload: dict) -> None:
    """A study's summary JSON, as every study writes it."""
    path.write_text(json.dumps(payload, indent=1, default=str))
