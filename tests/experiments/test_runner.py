"""t2mlr_jax/studies/runner.py: rows × repeats run in order into the journal, finished units resumed (from the
journal, or read back by the run function), a stopped unit ending the run (its message to the study's
sink), a study's own results file as its journal (its lines, tagged with its settings: another settings'
lines not read back), a table of rows × one repeat, and claims judged with the protocol's paired intervals
(a refused one listed, not judged)."""

import json

import pytest

from t2mlr_jax.studies import protocol, runner

METRIC = {"base": {0: 1.0, 1: 1.2, 2: 1.1}, "better": {0: 0.8, 1: 1.0, 2: 0.95}}


def counting(calls: list, stop_at=None):
    def run(row, seed):
        calls.append((row, seed))
        if (row, seed) == stop_at:
            return {"stopped_by": "SIGTERM", "step": 3}
        return {"loss": METRIC[row][seed]}

    return run


def test_rows_by_seeds_are_journaled_and_a_rerun_resumes_the_finished_ones(tmp_path):
    assert runner.grid(["a", "b"], [0, 1]) == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    assert runner.grid(["a", "b"], [0, 1], seed_major=True) == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]
    journal, calls = tmp_path / "rows.jsonl", []
    units = runner.grid(list(METRIC), [0, 1, 2])
    study = runner.Study(units, counting(calls, stop_at=("better", 1)), journal, resume=True)
    results, seconds, stopped = runner.run(study)
    assert stopped and calls == units[:5]  # stopped at its 5th unit: the units before it kept
    assert results == {
        "base": {0: {"loss": 1.0}, 1: {"loss": 1.2}, 2: {"loss": 1.1}},
        "better": {0: {"loss": 0.8}},
    }
    lines = [json.loads(line) for line in journal.read_text().splitlines()]
    assert [(x["row"], x["seed"], x["loss"]) for x in lines] == [(r, s, METRIC[r][s]) for r, s in units[:4]]
    assert set(seconds) == set(units[:4])

    calls.clear()
    again = runner.run(runner.Study(units, counting(calls), journal, resume=True))
    assert calls == units[4:] and not again.stopped  # only the units the journal lacks ran
    assert again.results == {
        row: {s: {"loss": v} for s, v in by_seed.items()} for row, by_seed in METRIC.items()
    }
    assert len(journal.read_text().splitlines()) == 6


def test_units_read_back_by_their_run_function_are_not_journaled_again(tmp_path):
    journal = tmp_path / "rows.jsonl"
    line = lambda row, seed, seconds, metrics: {"multiplier": row, "seed": seed, **metrics}
    run = lambda row, seed: runner.Ran({"loss": METRIC[row][seed]}, fresh=seed == 2)
    outcome = runner.run(runner.Study(runner.grid(list(METRIC), [0, 1, 2]), run, journal, line=line))
    assert [json.loads(x) for x in journal.read_text().splitlines()] == [
        {"multiplier": row, "seed": 2, "loss": METRIC[row][2]} for row in METRIC
    ]
    assert outcome.results["better"][1] == {"loss": 1.0}


def test_a_stopped_units_message_goes_to_the_studys_sink():
    messages = []
    study = runner.Study(runner.grid(["base"], [0, 1]), counting([], stop_at=("base", 1)))
    tag = lambda row, seed: f"runs/{row}"
    outcome = runner.run(runner.Study(study.units, study.run, tag=tag, on_stop=messages.append))
    assert outcome.stopped and outcome.results == {"base": {0: {"loss": 1.0}}}
    assert messages == ["runs/base: stopped by SIGTERM at step 3; rerun to resume"]


def test_a_studys_own_results_file_is_its_journal_under_a_settings_tag(tmp_path):
    """Lines in the study's own form (no row or seconds of the runner's), tagged with the settings: a rerun
    with the same settings reads them back, one with other settings computes its units again."""
    journal, calls = tmp_path / "cells.jsonl", []

    def score(cell, repeat):
        calls.append(cell)
        return {"cell": cell, "change": 0.5 * cell}

    def table(settings):
        line = lambda cell, repeat, seconds, metrics: metrics
        read = lambda x: ((x["cell"], 0), x)
        units = runner.grid([1, 2])
        return runner.Study(units, score, journal, line=line, read=read, settings=settings, resume=True)

    first = runner.run(table("abc"))
    assert runner.by_row(first.results) == {1: {"cell": 1, "change": 0.5}, 2: {"cell": 2, "change": 1.0}}
    assert [json.loads(x) for x in journal.read_text().splitlines()] == [
        {"cell": c, "change": 0.5 * c, "settings": "abc"} for c in (1, 2)
    ]
    again = runner.run(table("abc"))
    assert calls == [1, 2] and again.results == first.results  # read back as computed: without the tag
    runner.run(table("other"))
    assert calls == [1, 2, 1, 2] and len(journal.read_text().splitlines()) == 4


def test_claims_are_judged_with_the_protocols_intervals_and_refused_ones_listed():
    claims = [protocol.Claim("better", "base", "lower", -1)]
    judged = runner.judge(METRIC, claims)
    assert judged == protocol.compare(METRIC, claims)
    difference = protocol.interval([METRIC["better"][s] - METRIC["base"][s] for s in range(3)])
    assert judged["claims"][0]["difference"]["high"] == pytest.approx(difference.high)
    assert difference.high < 0
    assert judged["claims"][0]["verdict"] == protocol.REPRODUCED

    refuse = lambda row: ["another recipe"] if row == "better" else []
    refused = runner.judge(METRIC, claims, refuse, claimed_only=True)
    assert refused["claims"] == [] and refused["rows"] == {}
    assert refused["refused"] == {"better vs base": ["another recipe"]}


def test_the_summary_json_is_what_the_studies_write(tmp_path):
    runner.write_json(tmp_path / "results.json", {"rows": {"a": {0: 1.5}}, "path": tmp_path})
    assert json.loads((tmp_path / "results.json").read_text()) == {
        "rows": {"a": {"0": 1.5}},
        "path": str(tmp_path),
    }
