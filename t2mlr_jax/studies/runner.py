"""The one study runner: a study is a table of units, (row, repeat) pairs (rows × repeats, `grid`), with
what one unit runs. A repeat is whatever a row is measured again over: a seed, a text window, a split; a
study without claims is a table of rows × one repeat (`grid(rows)`, read back with `by_row`). `run` runs
the units in order under one progress bar, appends a journal line per unit computed now, and stops at a
unit a signal stopped (a rerun resumes); `judge` judges a study's claims with the protocol's paired
intervals over the repeats (protocol.compare); `run_shards` spreads the units over worker processes, each
the study's own command with --shard=I/N.

A unit is resumed by whichever keeps it: a run function that reads a finished unit back from its own
workdir returns `Ran(metrics, fresh=False)` (nothing journaled again); a plain dict is the runner's to
resume (with `resume`, a unit whose line is already in the journal is read back from it, not run). The
journal's lines are `line`'s (`unit_line`: row, seed, seconds, metrics), read back by its inverse `read`;
a study whose numbers depend on settings a rerun may change tags its lines with them (`settings`, e.g. a
fingerprint) and only lines with the same tag are read back: the study's own results file (the
recirculation sweep's cells.jsonl) is then its journal."""

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

Unit = tuple[Hashable, Hashable]  # (row, repeat): the repeat a seed, a text window, or the table's one (0)


class Ran(NamedTuple):
    """A unit's metrics, and whether anything was computed now (journaled) rather than read back."""

    metrics: dict
    fresh: bool = True


def unit_line(row: Hashable, seed: Hashable, seconds: float, metrics: dict) -> dict:
    """The journal's line of a unit: its row, repeat (under "seed") and wall seconds, then its metrics."""
    return {"row": row, "seed": seed, "seconds": seconds, **metrics}


def read_unit_line(line: dict) -> tuple[Unit, dict]:
    """`unit_line`'s inverse: (the line's unit, its metrics)."""
    return (line["row"], line["seed"]), {k: v for k, v in line.items() if k not in ("row", "seed", "seconds")}


@dataclasses.dataclass(frozen=True)
class Study:
    units: Sequence[Unit]  # in running order
    run: Callable[[Hashable, Hashable], dict | Ran]  # a unit's metrics; "stopped_by" when a signal stopped it
    journal: Path | None = None  # the results JSONL, a line per unit computed now
    line: Callable[[Hashable, Hashable, float, dict], dict] = unit_line  # (row, repeat, seconds, metrics)
    read: Callable[[dict], tuple[Unit, dict]] = read_unit_line  # line's inverse
    settings: str | None = None  # the tag of the journal lines this study writes and reads back
    resume: bool = False  # units whose line is in the journal are read back from it, not run
    tag: Callable[[Hashable, Hashable], str] = lambda row, repeat: str(row)  # names a stopped unit
    report: Callable[[Hashable, Hashable, dict, float], str] | None = None  # a line written after each unit
    on_stop: Callable[[str], object] = tqdm.write  # takes a stopped unit's message (cli.fail: exit with it)
    desc: str = "rows x seeds"

    @property
    def rows(self) -> list:
        return list(dict.fromkeys(row for row, _ in self.units))


class Outcome(NamedTuple):
    results: dict  # row -> repeat -> metrics, every row of the study (in order) a key
    seconds: dict  # (row, repeat) -> wall seconds of the units this call ran or read back
    stopped: bool  # a signal stopped a unit: the results hold the units before it


def grid(rows: Sequence, repeats: Sequence = (0,), seed_major: bool = False) -> list[Unit]:
    """rows × repeats, row by row (or, `seed_major`, one repeat of every row first); a table of rows × one
    repeat by default."""
    if seed_major:
        return [(row, repeat) for repeat in repeats for row in rows]
    return [(row, repeat) for row in rows for repeat in repeats]


def by_row(results: Mapping) -> dict:
    """row -> metrics of a table of rows × one repeat (the rows run so far)."""
    return {row: metrics for row, by_repeat in results.items() for metrics in by_repeat.values()}


def journaled(study: Study) -> dict[Unit, dict]:
    """The units already in the study's journal with its settings: unit -> the line's metrics, read back by
    `study.read` (the last line wins)."""
    if study.journal is None or not study.journal.exists():
        return {}
    lines = [json.loads(text) for text in study.journal.read_text().splitlines() if text.strip()]
    if study.settings is not None:  # a unit computed under other settings: not this study's numbers
        lines = [x for x in lines if x.pop("settings", None) == study.settings]
    return dict(study.read(x) for x in lines)


def run(study: Study) -> Outcome:
    """Every unit of `study` in order (see the module's docstring for what is resumed how)."""
    results = {row: {} for row in study.rows}
    seconds = {}
    done = journaled(study) if study.resume else {}
    for row, repeat in tqdm(study.units, desc=study.desc, file=sys.stderr):
        started = time.time()
        if (row, repeat) in done:
            ran = Ran(done[row, repeat], fresh=False)
        else:
            ran = study.run(row, repeat)
            ran = ran if isinstance(ran, Ran) else Ran(ran)
        if "stopped_by" in ran.metrics:
            tag = study.tag(row, repeat)
            study.on_stop(
                (f"{tag}: " if tag else "")
                + f"stopped by {ran.metrics['stopped_by']} at step {ran.metrics['step']}; rerun to resume"
            )
            return Outcome(results, seconds, True)
        seconds[row, repeat] = round(time.time() - started, 1)
        if ran.fresh and study.journal is not None:
            with open(study.journal, "a") as f:
                line = study.line(row, repeat, seconds[row, repeat], ran.metrics)
                tagged = line if study.settings is None else {**line, "settings": study.settings}
                f.write(json.dumps(tagged, default=str) + "\n")
        results[row][repeat] = ran.metrics
        if study.report:
            tqdm.write(study.report(row, repeat, ran.metrics, seconds[row, repeat]))
    return Outcome(results, seconds, False)


def values(results: Mapping, metric: Callable[[dict], float]) -> dict:
    """row -> repeat -> the unit's `metric`, as protocol.compare takes them."""
    return {row: {seed: metric(r) for seed, r in by_seed.items()} for row, by_seed in results.items()}


def judge(
    values: Mapping[str, Mapping[Hashable, float]],
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
