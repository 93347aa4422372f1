"""Fig. 8 of the T²MLR paper (../shared/papers/000, appendix E.2): the fusion gate over training — tanh γ_rec,
tanh γ_in and the mean gate activations σ(f_rec), σ(f_in) — one panel per quantity, one line per run (e.g.
one per layer window). The paper finds γ_rec settling positive and γ_in negative.

Everything is read from each run's metrics.jsonl (train lines), through the reader of tools/report.py
(t2mlr_jax.analysis.run_logs): the trainer logs tanh γ itself (`tanh_rezero_gamma_*`, model/fusion.py's
gamma_stats; plotted as logged, not transformed again) and the gate activations as per-token means over
recurrent positions (`gate/*`, the mixer's statistics). A WORKDIR is one run or a multi-architecture
workdir (its runs without gates, such as the transformer baseline, are skipped).

  python -m experiments.gate_trajectories runs/w5_26 runs/w13_18                 # two layer windows
  python -m experiments.gate_trajectories runs/w5_26 runs/w13_18 --labels="paper 5-26,paper 13-18"
  python -m experiments.gate_trajectories --preset=cpu    # trains two tiny windows first (minutes)

The cpu preset trains configs/smollm135m_t2mlr.py:cpu (4 layers x 64 wide, offline Shakespeare) at code
windows 1-2 and 0-3 with the framework's trainer into <out>/middle and <out>/full (a rerun skips
finished runs; <out>/.jax_cache keeps compiled steps).

Writes, in --out (default WORKDIR/gate_trajectories for the first WORKDIR, runs/gate_trajectories_cpu for the
preset):
  results.json  per run: label, workdir, window, and per quantity its (step, value) series in step order and
                its final value
  results.md    the final values per run and quantity; also printed
  results.png   one panel per quantity, one line per run
Bad input (a missing WORKDIR, a metrics.jsonl without gate metrics, a malformed line) is one `error:` line
on stderr and exit status 2, with nothing written.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from t2mlr_jax.analysis.plots import finish, save, subplots
from t2mlr_jax.analysis.run_logs import ReportError, RunLog, is_gate_key, load_runs
from t2mlr_jax.config.cli import OneLineParser, fail
from t2mlr_jax.studies import ROOT, runner
from t2mlr_jax.studies.analysis_common import setup_jax, train_run
from t2mlr_jax.studies.benchmarks.report import markdown_table

COMMAND = "python -m experiments.gate_trajectories"
# The quantities of Fig. 8 first, in this order (the other logged gate keys follow, titled by their key).
TITLES = {
    "tanh_rezero_gamma_recurrent_gate": "tanh γ_rec",
    "tanh_rezero_gamma_input_gate": "tanh γ_in",
    "tanh_rezero_gamma": "tanh γ",  # the single-gamma mixers (alpha_coupled)
    "gate/recurrent_gate": "mean recurrent gate σ(f_rec)",
    "gate/input_gate": "mean input gate σ(f_in)",
}
CPU_CONFIG = ROOT / "configs" / "smollm135m_t2mlr.py"
CPU_WINDOWS = {"middle": (1, 2), "full": (0, 3)}  # code 0-based (l_start, l_end) of its 4 layers
CPU_STEPS = 60


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = OneLineParser(prog=COMMAND, description=__doc__)
    parser.add_argument("workdirs", nargs="*", type=Path, metavar="WORKDIR", help="main.py training workdirs")
    parser.add_argument(
        "--labels", help="comma list, one legend label per WORKDIR (default: folder + window)"
    )
    parser.add_argument("--out", type=Path, help="output folder (default: see above)")
    parser.add_argument(
        "--preset", choices=["cpu"], help="cpu: train two tiny layer windows (no WORKDIR) and plot them"
    )
    parser.add_argument(
        "--steps", type=int, default=CPU_STEPS, help="training steps of the cpu preset's runs"
    )
    return parser.parse_args(argv)


# ---------------------------------------------------------------------------------------------- training
# The cpu presets' runs (experiments/future_token_probe.py builds its two with cpu_config too), trained by
# analysis_common.train_run.


def cpu_config(preset: str, steps: int, changes: dict):
    """configs/smollm135m_t2mlr.py at `preset` (e.g. "cpu", "baseline,cpu") with `steps` and dotted-path
    `changes`; built and checked (architecture, data paths) before anything is trained."""
    from t2mlr_jax.architectures import build_architecture
    from t2mlr_jax.config.edit import config_module, set_path
    from t2mlr_jax.experiment import resolve
    from t2mlr_jax.train.build_data import build_data_source

    config = config_module(CPU_CONFIG).get_config(preset)
    config.train.steps = steps
    for path, value in changes.items():
        set_path(config, path, value)
    typed = resolve(config)
    build_architecture(typed)
    build_data_source(typed)
    return config


def train_cpu_windows(out: Path, steps: int) -> list[Path]:
    try:
        configs = {
            name: cpu_config(
                "cpu",
                steps,
                {"model.recurrence.l_start": a, "model.recurrence.l_end": b, "train.log_every": 2},
            )
            for name, (a, b) in CPU_WINDOWS.items()
        }
    except (ValueError, KeyError, FileNotFoundError) as e:
        fail(e)
    setup_jax(out)
    train, named = (lambda name, _: train_run(configs[name], out / name)), (lambda name, _: str(out / name))
    # a window a signal stopped ends the command in one error line (a rerun resumes it)
    runner.run(runner.Study(runner.grid(list(configs)), train, tag=named, on_stop=fail, desc="windows"))
    return [out / name for name in configs]


# ---------------------------------------------------------------------------------------------- reading


def window(run: RunLog) -> list[int] | None:
    """The run's T²MLR window as code (l_start, l_end), from its run_config.json."""
    from t2mlr_jax.model.config import resolve_range

    model = run.config.get("model", {})
    rec = model.get("recurrence")
    return list(resolve_range(rec["l_start"], rec["l_end"], model["num_layers"])) if rec else None


def series(run: RunLog, key: str) -> dict:
    """The logged train values of `key` in step order (a step logged twice keeps its last line)."""
    by_step = {
        r["step"]: r[key]
        for r in run.records
        if r["split"] == "train" and isinstance(r.get(key), (int, float)) and math.isfinite(r[key])
    }
    steps = sorted(by_step)
    return {"step": steps, "value": [by_step[s] for s in steps]}


def gated_runs(workdir: Path, label: str | None) -> list[dict]:
    """The runs of `workdir` that log gate metrics, each with its label, window and series."""
    runs = [run for run in load_runs(workdir) if any(is_gate_key(k) for r in run.records for k in r)]
    if not runs:
        raise ReportError(
            f"{workdir}: no gate metrics (gate/*, tanh_rezero_gamma*) in its metrics.jsonl; gate "
            "trajectories need a T²MLR run (a transformer logs none)"
        )
    found = []
    for run in runs:
        span = window(run)
        name = label or workdir.name + (f" (layers {span[0]}–{span[1]})" if span else "")
        keys = sorted({k for r in run.records if r["split"] == "train" for k in r if is_gate_key(k)})
        logged = {k: series(run, k) for k in keys}
        found.append(
            {
                "label": name if len(runs) == 1 else f"{name}: {run.name}",
                "workdir": str(run.path),
                "arch": run.name,
                "window": span,
                "series": logged,
                "final": {k: s["value"][-1] for k, s in logged.items() if s["value"]},
            }
        )
    return found


def quantity_order(runs: list[dict]) -> list[str]:
    logged = {k for run in runs for k in run["series"]}
    return [k for k in TITLES if k in logged] + sorted(logged - set(TITLES))


# ---------------------------------------------------------------------------------------------- report


def render(meta: dict, runs: list[dict]) -> str:
    keys = meta["quantities"]
    rows = [
        [
            run["label"],
            "—" if run["window"] is None else f"{run['window'][0]}–{run['window'][1]}",
            max((s["step"][-1] for s in run["series"].values() if s["step"]), default="—"),
            *("—" if k not in run["final"] else f"{run['final'][k]:+.4f}" for k in keys),
        ]
        for run in runs
    ]
    header = ["Run", "Window (code layers)", "Last step", *(TITLES.get(k, k) for k in keys)]
    return "\n".join(
        [
            "# Gate trajectories (T²MLR Fig. 8)",
            "",
            f"`{meta['command']}`; wall time {meta['wall_seconds']:.0f} s.",
            "",
            "Final logged values (train split):",
            "",
            markdown_table(header, rows),
            "",
            "- tanh γ as the trainer logs it (`tanh_rezero_gamma_*`); gate means over recurrent tokens "
            "(`gate/*`), averaged over each logging window. The paper: γ_rec → positive, γ_in → negative.",
            "- Curves: results.png (one panel per quantity, one line per run).",
        ]
    )


def plot(meta: dict, runs: list[dict], path: Path) -> None:
    keys = meta["quantities"]
    fig, axes = subplots(1, len(keys), figsize=(4.6 * len(keys), 3.8), squeeze=False)
    for ax, key in zip(axes[0], keys):
        for run in runs:
            s = run["series"].get(key)
            if s and s["step"]:
                ax.plot(s["step"], s["value"], marker=".", label=run["label"])
        if key.startswith("tanh_"):
            ax.axhline(0.0, color="grey", lw=0.8)
        finish(ax, TITLES.get(key, key))
    save(fig, path)


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    started = time.time()
    if args.preset and args.workdirs:
        fail("--preset=cpu trains its own runs: give WORKDIRs or --preset=cpu, not both")
    if not args.preset and not args.workdirs:
        fail("give at least one WORKDIR (or --preset=cpu to train two tiny windows first)")
    labels = [s.strip() for s in args.labels.split(",")] if args.labels else None
    if labels and len(labels) != len(args.workdirs):
        fail(f"--labels has {len(labels)} labels for {len(args.workdirs)} WORKDIRs")
    try:  # bad workdirs fail here, before anything is trained or written
        runs = [r for i, w in enumerate(args.workdirs) for r in gated_runs(w, labels and labels[i])]
    except ReportError as e:
        fail(e)
    out = args.out or (
        Path("runs/gate_trajectories_cpu") if args.preset else args.workdirs[0] / "gate_trajectories"
    )
    if args.preset:
        runs = [r for w in train_cpu_windows(out, args.steps) for r in gated_runs(w, None)]
    meta = {
        "command": " ".join([COMMAND, *argv]),
        "wall_seconds": round(time.time() - started, 1),
        "quantities": quantity_order(runs),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"meta": meta, "runs": runs}, indent=1))
    markdown = render(meta, runs)
    (out / "results.md").write_text(markdown + "\n")
    plot(meta, runs, out / "results.png")
    print(markdown)
    print(f"\nwrote {out / 'results.json'}, {out / 'results.md'}, {out / 'results.png'}")
    return {"meta": meta, "runs": runs}
