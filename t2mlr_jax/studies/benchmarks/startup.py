"""Seconds from `python main.py` to its first step, for the :cpu presets and the 135M step, from a cold and
from a warm persistent compilation cache, optionally side by side with another checkout of the code.

Each run is a fresh `main.py` process in a fresh workdir; it is stopped once its progress bar shows the
first step (what happens after is not start-up). "to first step" is read off that bar by this script,
so it measures any version of the code the same way; this code's runs also write the phases of that
time (imports, config, state, trace, compile, data, first step: t2mlr_jax/train/startup.py), which the
tables show. Cold: a new, empty cache directory; warm: the same directory again, right after. With
--steady=N each training preset then also trains N steps from the warm cache, timed per step (the median
over 5-step intervals: logging and checkpoints included, an interval holding a compilation left out).
Every repetition runs each preset's code variants one after the other, the order rotated per repetition;
tables report medians, and ratios are the baseline's seconds over ours (> 1: ours is faster), the median
of the per-repetition ratios.

  python -m experiments.startup                                  # every preset, 3 repetitions
  git worktree add /tmp/before 7c7146d
  python -m experiments.startup --baseline_src=/tmp/before --presets=t2mlr --steady=100

Writes runs.jsonl (one line per run), results.json and results.md (the tables, also printed) in --out
(default runs/startup).
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from t2mlr_jax.config.cli import OneLineParser, fail
from t2mlr_jax.studies import ROOT
from t2mlr_jax.studies.benchmarks.report import markdown_table
from t2mlr_jax.train.startup import PHASES, STARTUP

COMMAND = "python -m experiments.startup"
FIRST_STEP = re.compile(rb"\|\s*1/\d+ \[")  # tqdm's bar at its first step: "| 1/20 ["


def backbone_135m() -> list[str]:
    """Flags that put SmolLM2-135M's shape back over the :cpu preset's tiny backbone, T²MLR at the paper's
    (5,26) window; the preset keeps its data, rows, dtype and D, B."""
    from configs.recipes import backbone_preset, paper_window
    from t2mlr_jax.config.edit import config_module
    from t2mlr_jax.model.presets import smollm2_135m

    cpu = config_module(ROOT / "configs" / "smollm135m_t2mlr.py").get_config("cpu")
    fields = {**backbone_preset(smollm2_135m()), **paper_window(5, 26)}
    changed = {p: v for p, v in fields.items() if p.startswith("model.") and _get(cpu, p) != v}
    return [f"--config.{path}={value}" for path, value in changed.items() if path != "model.dtype"]


def _get(config, path: str):
    for name in path.split("."):
        config = config[name]
    return config


TRAINING_FREE = ("recirculation",)  # no train steps: no steady state to time
PRESETS = {  # name -> (config, extra main.py flags, about)
    "t2mlr": ("configs/smollm135m_t2mlr.py:cpu", [], "T²MLR :cpu (3.3M parameters, 4 x 64)"),
    "lrt": ("configs/lrt_nanochat.py:cpu", [], "the LRT :cpu (MoE, Muon; 4 x 128)"),
    "s5": (
        "configs/s5_retrieval_t2mlr.py:cpu",
        [],
        "T²MLR :cpu on S5-retrieval, examples generated on the fly",
    ),
    "recirculation": (
        "configs/recirculation.py:cpu",
        [],
        "training-free recirculation on the shipped SmolLM2-135M; its first step is its first cell",
    ),
    "t2mlr_135m": ("configs/smollm135m_t2mlr.py:cpu", backbone_135m, "T²MLR on SmolLM2-135M, 4 x 64 rows"),
    "t2mlr_135m_per_layer": (
        "configs/smollm135m_t2mlr.py:cpu",
        lambda: [*backbone_135m(), "--config.model.scan_layers=False"],
        "the same, the blocks' weights per layer (model.scan_layers=False)",
    ),
}


def run_once(
    python: str, src: Path, preset: str, cache: Path, workdir: Path, timeout: float, steps: int = 0
) -> dict:
    """One main.py run of `src`'s code: seconds to its first step and the phases the code wrote (none for
    code without startup.json), the run stopped there; or with `steps`, trained that far and timed per
    step: the median over the intervals between its logged training records, every 5 steps (logging and
    checkpoints included; an interval in which a new program compiled, e.g. the LRT's next sampled P,
    does not move the median)."""
    config, extra, _ = PRESETS[preset]
    flags = extra() if callable(extra) else extra
    command = [
        python,
        str(src / "main.py"),
        f"--config={src / config}",
        f"--workdir={workdir}",
        f"--config.compilation_cache={cache}",
        *flags,
        *([f"--config.train.steps={steps}", "--config.train.log_every=5"] if steps else []),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_FLAGS"))}
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=src, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    seen, first_step = b"", None
    try:
        while time.perf_counter() - start < timeout and (steps or first_step is None):
            ready, _, _ = select.select([process.stderr], [], [], 0.05)
            chunk = os.read(process.stderr.fileno(), 65536) if ready else b""
            if ready and not chunk:  # the process ended
                break
            seen += chunk
            if first_step is None and FIRST_STEP.search(seen):
                first_step = time.perf_counter() - start
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
        process.wait()
    tail = seen.decode("utf-8", "replace")[-2000:]
    if first_step is None or steps and process.returncode != 0:
        raise RuntimeError(f"{preset} ({src}) did not run to its end within {timeout:.0f} s:\n{tail}")
    record = {"to_first_step": round(first_step, 3)}
    if steps:
        logged = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
        train = [r for r in logged if r["split"] == "train"]
        intervals = [(b["time"] - a["time"]) / (b["step"] - a["step"]) for a, b in zip(train, train[1:])]
        record.update(seconds_per_step=float(np.median(intervals)), intervals=intervals)
    written = workdir / STARTUP
    if written.is_file():
        record.update(json.loads(written.read_text()))
    return record


METRIC = {"cold": "to_first_step", "warm": "to_first_step", "steady": "seconds_per_step"}


def summarise(runs: list[dict], codes: list[str]) -> dict:
    """Per preset and run kind (cold, warm, steady): each code's median (seconds to the first step, or per
    step) and median phases, and each other code's median per-repetition ratio to the first code's."""
    table = {}
    for preset in dict.fromkeys(r["preset"] for r in runs):
        for kind, metric in METRIC.items():

            def of(code):
                return [r for r in runs if (r["preset"], r["cache"], r["code"]) == (preset, kind, code)]

            cell = {}
            for code in codes:
                if mine := of(code):
                    phases = {p: [r["phases"][p] for r in mine if p in r.get("phases", {})] for p in PHASES}
                    cell[code] = {
                        metric: float(np.median([r[metric] for r in mine])),
                        "runs": [r[metric] for r in mine],
                        "phases": {p: float(np.median(v)) for p, v in phases.items() if v},
                    }
            first = {r["rep"]: r[metric] for r in of(codes[0])}
            for code in codes[1:]:
                ratios = [r[metric] / first[r["rep"]] for r in of(code) if r["rep"] in first]
                if ratios:
                    cell[code]["ratio"] = float(np.median(ratios))
            if cell:
                table[f"{preset}/{kind}"] = cell
    return table


def markdown(table: dict, codes: list[str]) -> str:
    """One row per preset and run kind: each code's median, the others' ratio to the first, and the
    first code's phases."""
    header = ["preset / run", *codes, *(f"{c} / {codes[0]}" for c in codes[1:]), *PHASES]
    rows = []
    for name, cell in table.items():
        metric = METRIC[name.rsplit("/", 1)[1]]
        unit = " s/step" if metric == "seconds_per_step" else " s"
        phases = cell.get(codes[0], {}).get("phases", {})
        rows.append(
            [
                name,
                *(f"{cell[c][metric]:.3g}{unit}" if c in cell else "" for c in codes),
                *(f"{cell[c]['ratio']:.2f}×" if "ratio" in cell.get(c, {}) else "" for c in codes[1:]),
                *(f"{phases[p]:.2f}" if p in phases else "" for p in PHASES),
            ]
        )
    return markdown_table(header, rows)


def main(argv: list[str]) -> None:
    parser = OneLineParser(prog=COMMAND, description=__doc__)
    parser.add_argument("--presets", default=",".join(PRESETS), help=f"comma list of {', '.join(PRESETS)}")
    parser.add_argument("--reps", type=int, default=3, help="repetitions (default 3)")
    parser.add_argument(
        "--baseline_src", help="another checkout of this repo, run side by side with this one"
    )
    parser.add_argument("--out", default="runs/startup", help="output directory (default runs/startup)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds a run may take to its first step")
    parser.add_argument("--python", default=sys.executable, help="the interpreter both codes run under")
    parser.add_argument(
        "--steady",
        type=int,
        default=0,
        help="also train each training preset this many steps (warm cache) and time its steps (0 = no)",
    )
    args = parser.parse_args(argv)
    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    unknown = [p for p in presets if p not in PRESETS]
    if unknown or not presets:
        fail(f"--presets: unknown {unknown or 'none given'}; expected a comma list of {', '.join(PRESETS)}")
    if args.reps < 1:
        fail(f"--reps must be >= 1, got {args.reps}")
    sources = {"ours": ROOT}
    if args.baseline_src:
        baseline = Path(args.baseline_src).resolve()
        if not (baseline / "main.py").is_file():
            fail(f"--baseline_src {baseline} is not a checkout of this repo (it has no main.py)")
        sources["baseline"] = baseline
    codes = list(sources)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from tqdm import tqdm

    kinds = {"cold": 0, "warm": 0, **({"steady": args.steady} if args.steady else {})}
    plan = [
        (rep, preset, code, kind)
        for rep in range(args.reps)
        for preset in presets
        for code in codes[rep % len(codes) :] + codes[: rep % len(codes)]  # the order rotated per rep
        for kind in kinds
        if not (kind == "steady" and preset in TRAINING_FREE)
    ]
    runs = []
    scratch = Path(tempfile.mkdtemp(prefix="t2mlr-startup-"))
    try:
        with open(out / "runs.jsonl", "w") as log, tqdm(plan, desc="startup", unit="run") as bar:
            for rep, preset, code, kind in bar:
                bar.set_postfix_str(f"{preset} {code} {kind}")
                cache = scratch / f"cache-{rep}-{preset}-{code}"  # new for each cold run, then kept
                if kind == "cold":
                    shutil.rmtree(cache, ignore_errors=True)
                workdir = scratch / f"run-{rep}-{preset}-{code}-{kind}"
                record = run_once(
                    args.python, sources[code], preset, cache, workdir, args.timeout, kinds[kind]
                )
                record = {**record, "preset": preset, "code": code, "cache": kind, "rep": rep}
                runs.append(record)
                log.write(json.dumps(record) + "\n")
                log.flush()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    table = summarise(runs, codes)
    results = {
        "command": " ".join([COMMAND, *argv]),
        "sources": {c: str(s) for c, s in sources.items()},
        "commits": {c: _commit(s) for c, s in sources.items()},
        "cpu_count": os.cpu_count(),
        "table": table,
    }
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    text = markdown(table, codes)
    (out / "results.md").write_text(f"`{results['command']}` ({results['commits']})\n\n{text}\n")
    print(text)


def _commit(src: Path) -> str | None:
    try:
        return subprocess.run(
            ["git", "-C", str(src), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
