"""The recirculation sweep (Mozer et al.; t2mlr_jax.architectures.recirculation.forward): the % perplexity
change against the unmodified model of every cell (scheme, alpha, source, destination) of a grid, on
config.init_from's model over the fixed eval windows of config.data, with the paper's controls.
Registered as the study of arch "recirculation" (it has nothing to train): main.py's --mode=train and
experiments/recirculation.py run it. Cells are scored by recirculation_scoring.py, run as a table of the
study runner (runner.py: the cells × one repeat, cells.jsonl its journal), drawn by recirculation_plots.py.

Grid (config.recirculation.sweep_*): alphas x schemes x pairs destination < source <= destination +
max_gap over every stride-th block, each cell scored as the section says (stack two | single, evaluation
serial | parallel); one compiled function per (source, destination, scheme), alpha a traced argument.
Controls: every cell's logits also at temperature sweep_control_temperature (the base model's and the best
cell's answer "is the gain additive?"), and training-free looping (blocks d+1..s again after s) for every
pair. Serial check: the sweep_serial_check best cells scored by both evaluations, timed side by side.
Selection and report (protocol.py): cells are ranked on a seeded share of the eval windows
(sweep_selection_fraction) and the best one is reported on the others, with an interval over them.

Writes in workdir: cells.jsonl (a line per cell as it finishes; a rerun with the same settings skips the
cells there), results.json, heatmap_<scheme>_alpha<alpha>.png (per alpha and scheme), heatmap_looping.png
and gain_by_position.png (the best cell's change per position in the window).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import time
from pathlib import Path

import jax
import numpy as np

from t2mlr_jax.architectures import build_architecture
from t2mlr_jax.architectures.recirculation.mix import Recirculation
from t2mlr_jax.config.convert import to_dict
from t2mlr_jax.config.sections import Experiment
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.storage.workdir import write_atomic
from t2mlr_jax.studies import runner
from t2mlr_jax.studies.protocol import interval, splits
from t2mlr_jax.studies.recirculation_plots import write_plots
from t2mlr_jax.studies.recirculation_scoring import (
    POSITION_BUCKETS,
    Cell,
    Scoring,
    change_pct,
    position_counts,
    record,
    score,
    scorer,
    serial_check,
    windows,
)
from t2mlr_jax.train import init_from, startup

CELLS, RESULTS = "cells.jsonl", "results.json"


@dataclasses.dataclass(frozen=True)
class Plan:
    """The checked sweep: the grid's cells, the looping controls, how cells are scored."""

    grid: list[Cell]
    looping: list[Cell]
    scoring: Scoring
    serial_check: int


# ---------------------------------------------------------------------------------------------------
# The plan, checked before anything is loaded or compiled


def sweep_pairs(num_layers: int, max_gap: int, stride: int) -> list[tuple[int, int]]:
    """(source, destination) pairs over blocks 0, stride, 2 stride, ...: destination < source <= destination
    + max_gap."""
    layers = range(0, num_layers, stride)
    return [(s, d) for d in layers for s in layers if d < s <= d + max_gap]


def _floats(text: str, what: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise ValueError(f"recirculation.{what} must be a comma list of numbers, got {text!r}") from e
    if not values:
        raise ValueError(f"recirculation.{what} is empty")
    return values


def plan(config: Experiment, model: ModelConfig) -> Plan:
    """Every cell's settings checked up front: one clear ValueError, nothing compiled."""
    s = config.recirculation
    if s.sweep_stride < 1 or s.sweep_max_gap < 1 or s.sweep_serial_check < 0:
        raise ValueError(
            "recirculation: sweep_stride and sweep_max_gap must be >= 1 and sweep_serial_check >= 0, got "
            f"{s.sweep_stride}, {s.sweep_max_gap}, {s.sweep_serial_check}"
        )
    if not 0 < s.sweep_selection_fraction < 1:
        raise ValueError(
            f"recirculation.sweep_selection_fraction must be in (0, 1), got {s.sweep_selection_fraction}"
        )
    if s.sweep_control_temperature <= 0:
        raise ValueError(
            f"recirculation.sweep_control_temperature must be > 0, got {s.sweep_control_temperature}"
        )
    pairs = sweep_pairs(model.num_layers, s.sweep_max_gap, s.sweep_stride)
    if not pairs:
        raise ValueError(
            f"recirculation: no (source, destination) pair of this {model.num_layers}-layer model at most "
            f"{s.sweep_max_gap} apart on a stride of {s.sweep_stride}"
        )
    schemes = [x.strip() for x in s.sweep_schemes.split(",") if x.strip()]
    alphas = _floats(s.sweep_alphas, "sweep_alphas")
    grid = [
        Cell("recirculation", src, dst, scheme, alpha)
        for src, dst in pairs
        for scheme in schemes or [""]  # "" fails the check below with the list of schemes
        for alpha in alphas
    ]
    for cell in grid:
        Recirculation(cell.source, cell.destination, cell.alpha, cell.scheme, s.ramp).check(model.num_layers)
    controls = (s.temperature, s.sweep_control_temperature) if s.sweep_controls else (s.temperature,)
    scoring = Scoring(s.stack, s.evaluation, s.parallel_tol, s.parallel_max_passes, s.ramp, controls)
    looping = [Cell("looping", src, dst) for src, dst in pairs] if s.sweep_controls else []
    return Plan(grid, looping, scoring, s.sweep_serial_check)


def check_window(config: Experiment, max_seq_len: int) -> int:
    """The eval window (eval.window; 0 = data.seq_len), which must fit the model's
    context."""
    window = config.eval.window or config.data.seq_len
    if window > max_seq_len:
        raise ValueError(
            f"eval.window {window} is longer than the model's context (model.max_seq_len {max_seq_len})"
        )
    return window


# ---------------------------------------------------------------------------------------------------
# The sweep


def _cell(line: dict) -> Cell:
    return Cell(**{f.name: line[f.name] for f in dataclasses.fields(Cell)})


def fingerprint(config: Experiment, scoring: Scoring) -> str:
    """What a cell's numbers depend on: the model, the windows, how cells are scored."""
    d = config.data
    what = dict(
        init_from=config.init_from,
        model=to_dict(config)["model"],
        data={
            **{k: getattr(d, k) for k in ("kind", "tokenizer", "eval_path", "eval_source", "seq_len")},
            "eval_seq_len": config.eval.window,  # its key in fingerprints already written: they stay valid
        },
        windows=(config.eval.num_examples, config.eval.batch_size, config.seed),
        scoring=dataclasses.asdict(scoring),
        per_window=True,  # lines carry per-window sums (earlier ones did not)
    )
    return hashlib.sha1(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:12]


def checked(config: Experiment):
    """Every setting of the sweep checked, nothing loaded or compiled: (the backbone, a loader of the
    pretrained weights, the plan, the eval window)."""
    arch = build_architecture(config, "recirculation")
    load = init_from.start_weights(config, arch)  # the checkpoint, checked now
    if load is None:
        raise ValueError("the recirculation sweep needs a pretrained model: set config.init_from")
    return arch.backbone, load, plan(config, arch.backbone), check_window(config, arch.max_seq_len)


def cell_study(cells: list[Cell], score_cell, workdir: Path, settings: str) -> runner.Study:
    """`cells` as a table of the study runner (rows × one repeat), journaled in workdir/cells.jsonl: a line
    per cell (its record, tagged with the settings), the cells there with these settings read back."""
    return runner.Study(
        runner.grid(cells),
        lambda cell, _: score_cell(cell),
        workdir / CELLS,
        line=lambda cell, _, seconds, record: record,  # a record carries its own scoring seconds
        read=lambda line: ((_cell(line), 0), line),
        settings=settings,
        resume=True,
        desc="recirculation",
    )


def run_sweep(config: Experiment, workdir: Path) -> dict:
    """The sweep of config.recirculation on config.init_from's model; resumes from workdir/cells.jsonl.
    Every setting is checked before anything is loaded or compiled. Returns what results.json holds."""
    started = time.perf_counter()
    model, load, sweep, window = checked(config)
    startup.mark("config")
    batches = windows(config)
    startup.mark("data")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    settings = fingerprint(config, sweep.scoring)
    params = functools.cache(lambda: jax.device_put(load()))  # read only when a cell is due

    baseline = Cell("baseline")
    cells = [baseline, *sweep.grid, *sweep.looping]
    fresh = []  # the cells scored in this process

    def score_cell(cell: Cell) -> dict:
        if not fresh:
            params()
            startup.mark("state")
        raw = score(params(), batches, cell, scorer(model, cell, sweep.scoring), window)
        scored[cell] = record(cell, raw, scored.get(baseline), sweep.scoring.tol)
        fresh.append(cell)
        if len(fresh) == 1:  # its first cell's score includes tracing and compiling its program
            startup.mark("first_step")
            startup.write(workdir, cell=_name(cell), compilation_cache=jax.config.jax_compilation_cache_dir)
        return scored[cell]

    study = cell_study(cells, score_cell, workdir, settings)
    scored = {cell: line for (cell, _), line in runner.journaled(study).items()}  # the baseline, once known
    lines = runner.by_row(runner.run(study).results)
    base = lines[baseline]
    parts = splits(len(base["tokens_by_window"]), config.recirculation.sweep_selection_fraction, config.seed)
    grid = sorted((lines[c] for c in sweep.grid), key=lambda r: _change_on(r, base, parts.selection))
    checked_cells = [
        Cell("check", best["source"], best["destination"], best["scheme"], best["alpha"])
        for best in grid[: sweep.serial_check]
    ]
    check = lambda cell: serial_check(model, params(), batches, cell, sweep.scoring, window)
    checks = runner.run(cell_study(checked_cells, check, workdir, settings)).results
    checks = [checks[cell][0] for cell in checked_cells]
    looping = [lines[c] for c in sweep.looping]
    results = _results(config, model, sweep, base, grid, looping, checks, batches, window, parts, settings)
    results["timings"] = {
        "run_seconds": time.perf_counter() - started,
        "cells_seconds": sum(lines[c]["seconds"] for c in cells),
        "evaluated_now": len(fresh),
        "reused": len(cells) - len(fresh),
    }
    write_atomic(workdir / RESULTS, json.dumps(results, indent=2) + "\n")
    write_plots(workdir, results)
    print(summary(results), flush=True)
    return results


def _name(cell: Cell) -> str:
    if cell.kind == "baseline":
        return "baseline"
    alpha = f" {cell.scheme} alpha {cell.alpha:g}" if cell.kind != "looping" else ""
    return f"{cell.kind} s={cell.source} d={cell.destination}{alpha}"


RAW = ("nll", "tokens", "bytes", "nll_by_position", "nll_by_window", "tokens_by_window")


def _shown(line: dict) -> dict:
    """A cell as results.json shows it: without the raw sums."""
    return {k: v for k, v in line.items() if k not in RAW}


def _change_on(cell: dict, baseline: dict, windows: np.ndarray) -> float:
    """`cell`'s % perplexity change against the baseline over these eval windows."""
    nll, base = (np.asarray(line["nll_by_window"])[windows].sum() for line in (cell, baseline))
    return change_pct(math.exp((nll - base) / np.asarray(baseline["tokens_by_window"])[windows].sum()), 1.0)


def _reported(cell: dict, baseline: dict, windows: np.ndarray) -> dict:
    """`cell`'s change on the report windows, with each window's (a chunk of text) and the interval over
    them."""
    nll, base = (np.asarray(line["nll_by_window"])[windows] for line in (cell, baseline))
    tokens = np.asarray(baseline["tokens_by_window"])[windows]
    counted = tokens > 0
    per_window = [change_pct(math.exp(d), 1.0) for d in (nll - base)[counted] / tokens[counted]]
    return {
        "change_pct": _change_on(cell, baseline, windows),
        "windows": int(counted.sum()),
        "per_window_pct": per_window,
        "interval": dataclasses.asdict(interval(per_window)),
    }


def _chosen(cell: dict, baseline: dict, parts) -> dict:
    """A cell chosen on the selection windows: its change there, and on the report windows."""
    return {
        **_shown(cell),
        "selection_change_pct": _change_on(cell, baseline, parts.selection),
        "report": _reported(cell, baseline, parts.report),
    }


def _results(
    config, model: ModelConfig, sweep: Plan, baseline, grid, looping, checks, batches, window, parts, settings
) -> dict:
    """results.json: the settings, the baseline, the grid best first (on the selection windows), the best
    cell and each scheme's best reported on the report windows, the controls, the serial check."""
    best, s = grid[0], config.recirculation
    counts = position_counts(batches, window)
    seen = counts > 0
    gain = np.subtract(baseline["nll_by_position"], best["nll_by_position"])[seen] / counts[seen]
    results = {
        "settings": {
            "init_from": config.init_from,
            "num_layers": model.num_layers,
            "windows": {"count": sum(len(b["tokens"]) for b in batches), "length": window},
            "tokens": baseline["tokens"],
            "alphas": sorted({c.alpha for c in sweep.grid}),
            "schemes": sorted({c.scheme for c in sweep.grid}),
            "max_gap": s.sweep_max_gap,
            "stride": s.sweep_stride,
            "pairs": len({(c.source, c.destination) for c in sweep.grid}),
            "scoring": dataclasses.asdict(sweep.scoring),
            "fingerprint": settings,
        },
        "selection": {
            "fraction": config.recirculation.sweep_selection_fraction,
            "selection_windows": parts.selection.tolist(),
            "report_windows": parts.report.tolist(),
        },
        "baseline": _shown(baseline),
        "best": _chosen(best, baseline, parts),
        # each scheme's own best (alpha, pair), chosen on the selection windows like `best` (grid is sorted)
        "best_by_scheme": {
            scheme: _chosen(next(c for c in grid if c["scheme"] == scheme), baseline, parts)
            for scheme in sorted({c["scheme"] for c in grid})
        },
        "grid": [_shown(c) for c in grid],
        "gain_by_position": {
            "bucket_start": (np.arange(POSITION_BUCKETS) * window // POSITION_BUCKETS)[seen].tolist(),
            "tokens": counts[seen].tolist(),
            "nll_gain": gain.tolist(),  # nats per token, baseline minus best cell: > 0 = the cell helps
            "change_pct": (100.0 * (np.exp(-gain) - 1.0)).tolist(),
        },
        "serial_check": [_shown(c) for c in checks],
    }
    if looping:
        results["controls"] = _controls(baseline, best, looping, sweep.scoring.temperatures[1])
    return results


def _controls(baseline: dict, best: dict, looping: list[dict], temperature: float) -> dict:
    """Temperature: is the best cell's change additive with the base model's at the control temperature
    (the paper: nearly, so recirculation is not a temperature effect)? Looping: blocks d+1..s run twice
    with nothing crossing tokens, over every pair of the grid."""
    alone, best_t = baseline["control_temperature"]["change_pct"], best["control_temperature"]["change_pct"]
    return {
        "temperature": {
            "temperature": temperature,
            "baseline_change_pct": alone,
            "best_change_pct": best["change_pct"],
            "combined_change_pct": best_t,
            "sum_of_separate_pct": alone + best["change_pct"],
            "non_additivity_pct": best_t - alone - best["change_pct"],
        },
        "looping": {
            "best": _shown(min(looping, key=lambda r: r["change_pct"])),
            "cells": [_shown(c) for c in looping],
        },
    }


def summary(results: dict) -> str:
    """A few lines: the baseline, the best cell, the controls, the serial check."""
    base, best = results["baseline"], results["best"]
    bpb = f", {base['bpb']:.4f} bits per byte" if "bpb" in base else ""
    report, interval_ = best["report"], best["report"]["interval"]
    lines = [
        f"baseline perplexity {base['perplexity']:.4f}{bpb} over {results['settings']['tokens']:.0f} tokens",
        f"best of {len(results['grid'])} cells on {len(results['selection']['selection_windows'])} selection "
        f"windows: {_name(_cell(best))} ({best['selection_change_pct']:+.3f}%); on the "
        f"{report['windows']} report windows {report['change_pct']:+.3f}% (95% over windows "
        f"[{interval_['low']:+.3f}, {interval_['high']:+.3f}])",
    ]
    if "controls" in results:
        t, loop = results["controls"]["temperature"], results["controls"]["looping"]["best"]
        lines += [
            f"temperature {t['temperature']:g}: base {t['baseline_change_pct']:+.3f}%, with the best cell "
            f"{t['combined_change_pct']:+.3f}% (sum of the two alone {t['sum_of_separate_pct']:+.3f}%)",
            f"looping control, best pair s={loop['source']} d={loop['destination']}: "
            f"{loop['change_pct']:+.3f}%",
        ]
    for c in results["serial_check"]:
        p, s = c["parallel"], c["serial"]
        passes = f"{p['passes']['mean']:.1f} passes (max {p['passes']['max']}), " if "passes" in p else ""
        lines.append(
            f"serial check s={c['source']} d={c['destination']} alpha {c['alpha']:g}: parallel {passes}"
            f"perplexity off by {c['perplexity_rel_diff']:.2e} (relative), {p['seconds']:.1f} s vs serial "
            f"{s['seconds']:.1f} s: x{c['speedup']:.1f}"
        )
    return "\n".join(lines)
