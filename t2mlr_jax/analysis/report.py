"""A training run summarized without TensorBoard: report.md and report.json (how the run ended, the run's
identity, final and best metrics, checkpoints, throughput, the slowest ops of a train.profile trace),
curves.png (loss, BPB, accuracy vs step)
and, for runs that log gates (T²MLR), gates.png (mean gate activations and ReZero gammas vs step).
tools/report.py is its CLI.

A workdir is one run (metrics.jsonl at its top) or a multi-architecture comparison (one run per
sub-folder holding a metrics.jsonl). Everything is read and checked (run_logs.py, run_ending.py) before
anything is written, so bad input leaves no partial report.
"""

from __future__ import annotations

import json
from pathlib import Path

from t2mlr_jax.analysis.plots import finish, save, subplots
from t2mlr_jax.analysis.profile_ops import newest_trace, ops_lines, slowest_ops
from t2mlr_jax.analysis.run_ending import current_summary, run_ending
from t2mlr_jax.analysis.run_logs import (
    RunLog,
    checkpoint_list,
    fmt,
    is_gate_key,
    mode_eval_results,
    split_report,
    throughput,
)
from t2mlr_jax.storage.workdir import CHECKPOINTS, PROFILE, RUN_CONFIG

# curves.png panels: (title, train key, eval key); train logs per-token accuracy as "accuracy".
CURVES = (
    ("loss", "loss", "loss"),
    ("bits per byte", "bpb", "bpb"),
    ("token accuracy", "accuracy", "token_accuracy"),
)
GATE_PANELS = (("gate means (gate/*)", "gate/"), ("ReZero gammas (*gamma*)", "gamma"))


def run_report(run: RunLog) -> dict:
    train = [r for r in run.records if r["split"] == "train"]
    checkpoints = checkpoint_list(run.path / CHECKPOINTS)
    ending = run_ending(run.path, run.records, checkpoints[-1]["step"] if checkpoints else None)
    summary, summary_note = current_summary(run.path, ending["sessions"])
    return {
        "name": run.name,
        "path": str(run.path.resolve()),
        "ending": ending,
        "config": run.config,
        "summary": summary,
        "summary_note": summary_note,
        "train": split_report(train),
        "eval": split_report([r for r in run.records if r["split"] == "eval"]),
        "mode_eval": mode_eval_results(run.path),
        "checkpoints": checkpoints,
        "throughput": throughput(train),
        "gate_keys": sorted({k for r in train for k in r if is_gate_key(k)}),
        "profile": profile_summary(run.path),
    }


def profile_summary(path: Path) -> dict | None:
    """The slowest ops of the run's train.profile trace (profile_ops), None when it traced none."""
    trace = newest_trace(path / PROFILE)
    return slowest_ops(trace) if trace else None


def build_report(workdir: Path, runs: list[RunLog]) -> dict:
    reports = [run_report(run) for run in runs]
    has_gates = any(r["gate_keys"] for r in reports)
    return {
        "workdir": str(workdir.resolve()),
        "runs": reports,
        "files": {
            "curves": "curves.png",
            "gates": "gates.png" if has_gates else None,
        },
    }


# ---------------------------------------------------------------------------------------------
# Rendering: report.md and the printed summary.


def fmt_bytes(n: int) -> str:
    size, unit = float(n), "B"
    for bigger in ("KiB", "MiB", "GiB"):
        if size < 1024:
            break
        size, unit = size / 1024, bigger
    return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"


def flatten(d: dict, prefix: str = "") -> dict:
    """{"model": {"hidden_size": 64}} -> {"model.hidden_size": 64}."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def headline(run: dict) -> str:
    """One line of identity: architecture, size, data, seed."""
    config, summary = run["config"], run["summary"] or {}
    model, data = config.get("model", {}), config.get("data", {})
    parts = [run["name"]]
    if "num_params" in summary:
        parts.append(f"{summary['num_params']:,} params")
    if "hidden_size" in model:
        parts.append(f"{model['hidden_size']} wide x {model.get('num_layers', '?')} layers")
    if data:
        what = data.get("task") or data.get("kind", "?")
        parts.append(f"data {what}" + (f", seq {data['seq_len']}" if "seq_len" in data else ""))
    if "seed" in config:
        parts.append(f"seed {config['seed']}")
    if not config:
        parts.append(f"no {RUN_CONFIG}")
    return ", ".join(parts)


def throughput_line(run: dict) -> str:
    t = run["throughput"]
    if t["steps_per_second"] == "unknown":
        return f"throughput unknown: {t['note']}"
    tokens = t["tokens_per_second"]
    tokens_text = f"{tokens:,.0f}" if isinstance(tokens, float) else tokens
    return f"{t['steps_per_second']:.3g} steps/s, {tokens_text} tokens/s ({t['note']})"


def checkpoints_line(run: dict) -> str:
    ckpts = run["checkpoints"]
    if not ckpts:
        return "no checkpoints"
    steps = ", ".join(str(c["step"]) for c in ckpts)
    total = fmt_bytes(sum(c["bytes"] for c in ckpts))
    return f"checkpoints at steps {steps} (latest {ckpts[-1]['step']}), {total} in all"


def key_metrics(split: dict, keys: tuple[str, ...]) -> str:
    final = split.get("final", {})
    shown = ", ".join(f"{k} {fmt(final[k])}" for k in keys if k in final)
    return f"@{final['step']}: {shown}" if final else "none logged"


def metrics_table(run: dict) -> list[str]:
    lines = ["| split | metric | final | best (step) |", "|---|---|---|---|"]
    for split in ("train", "eval"):
        report = run[split]
        for key, value in sorted(report.get("final", {}).items()):
            if key == "step" or isinstance(value, dict):
                continue
            best = report["best"].get(key)
            best_text = f"{fmt(best['value'])} ({best['step']})" if best else ""
            lines.append(f"| {split} | {key} | {fmt(value)} | {best_text} |")
    return lines


def run_markdown(run: dict) -> list[str]:
    lines = [
        f"## {run['name']}",
        "",
        f"- **{run['ending']['text']}**",
        f"- {headline(run)}",
        f"- folder: `{run['path']}`",
        *([f"- {run['summary_note']}"] if run["summary_note"] else []),
        f"- final train line at step {run['train'].get('final', {}).get('step', '-')}, "
        f"final eval at step {run['eval'].get('final', {}).get('step', '-')}",
        f"- {throughput_line(run)}",
        "",
        "### Metrics",
        "",
        *metrics_table(run),
        "",
        "### Checkpoints",
        "",
    ]
    if run["checkpoints"]:
        lines += ["| step | size | |", "|---|---|---|"]
        lines += [
            f"| {c['step']} | {fmt_bytes(c['bytes'])} | {'latest' if c['latest'] else ''} |"
            for c in run["checkpoints"]
        ]
    else:
        lines.append("none")
    if run["profile"]:
        lines += ["", "### Slowest ops (train.profile)", "", f"trace: `{run['profile']['trace']}`", ""]
        lines += ["| op | program | calls | seconds | share of op time |", "|---|---|---|---|---|"]
        lines += [
            f"| `{o['op']}` | {o['module']} | {o['calls']} | {o['seconds']:.4g} | {o['share']:.1%} |"
            for o in run["profile"]["ops"]
        ]
    if run["mode_eval"]:
        lines += ["", "### --mode=eval results", ""]
        lines += [
            f"- step {r['step']}: "
            + ", ".join(f"{k} {fmt(v)}" for k, v in r.items() if k != "step" and not isinstance(v, dict))
            for r in run["mode_eval"]
        ]
    config_rows = [f"| {k} | {fmt(v)} |" for k, v in sorted(flatten(run["config"]).items())]
    lines += ["", "### Config", "", f"<details><summary>{RUN_CONFIG}</summary>", ""]
    lines += ["| field | value |", "|---|---|", *config_rows] if config_rows else [f"no {RUN_CONFIG}"]
    return lines + ["", "</details>", ""]


def comparison_table(report: dict) -> list[str]:
    lines = [
        "| run | ended | params | steps | train loss | eval loss | eval bpb | token accuracy | exact match |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in report["runs"]:
        train, evals = run["train"].get("final", {}), run["eval"].get("final", {})
        cells = [
            run["ending"]["how"],
            (run["summary"] or {}).get("num_params", ""),
            train.get("step", ""),
            train.get("loss", ""),
            *(evals.get(k, "") for k in ("loss", "bpb", "token_accuracy", "exact_match")),
        ]
        lines.append(f"| {run['name']} | " + " | ".join(fmt(c) for c in cells) + " |")
    return lines + [""]


def markdown(report: dict) -> str:
    lines = [f"# Training report: `{report['workdir']}`", ""]
    if len(report["runs"]) > 1:
        lines += comparison_table(report)
    for run in report["runs"]:
        lines += run_markdown(run)
    lines += ["## Plots", "", f"![curves]({report['files']['curves']})", ""]
    gates = report["files"]["gates"]
    lines.append(f"![gates]({gates})" if gates else "No gate metrics (gate/*, *gamma*): no gates.png.")
    return "\n".join(lines) + "\n"


def text_summary(report: dict) -> str:
    lines = []
    for run in report["runs"]:
        lines += [
            headline(run),
            f"  {run['ending']['text']}",
            *([f"  {run['summary_note']}"] if run["summary_note"] else []),
            f"  train {key_metrics(run['train'], ('loss', 'accuracy', 'bpb'))}",
            f"  eval  {key_metrics(run['eval'], ('loss', 'token_accuracy', 'exact_match', 'bpb'))}",
            f"  {checkpoints_line(run)}",
            f"  {throughput_line(run)}",
            *("  " + line for line in (ops_lines(run["profile"]) if run["profile"] else [])),
        ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Plots.


def plot_series(ax, records: list[dict], split: str, key: str, label: str, style: str = "-") -> None:
    """The logged values of `key` in `split` against step; nothing when the run did not log it."""
    points = [
        (r["step"], r[key]) for r in records if r["split"] == split and isinstance(r.get(key), (int, float))
    ]
    if points:
        ax.plot(*zip(*points), style, marker="." if split == "train" else "o", label=label)


def plot_curves(runs: list[RunLog], path: Path) -> None:
    """One panel per metric that was logged; per run one colour, train solid, eval dashed."""
    logged = {k for run in runs for r in run.records for k in r}
    panels = [c for c in CURVES if {c[1], c[2]} & logged] or list(CURVES[:1])
    fig, axes = subplots(1, len(panels), figsize=(5 * len(panels), 3.8), squeeze=False)
    for ax, (title, train_key, eval_key) in zip(axes[0], panels):
        for i, run in enumerate(runs):
            plot_series(ax, run.records, "train", train_key, f"{run.name} train", f"C{i}-")
            plot_series(ax, run.records, "eval", eval_key, f"{run.name} eval", f"C{i}--")
        finish(ax, title)
    save(fig, path)


def plot_gates(runs: list[RunLog], path: Path) -> None:
    keys = sorted(
        {k for run in runs for r in run.records if r["split"] == "train" for k in r if is_gate_key(k)}
    )
    panels = [(title, [k for k in keys if mark in k]) for title, mark in GATE_PANELS]
    panels = [(title, panel_keys) for title, panel_keys in panels if panel_keys]
    fig, axes = subplots(1, len(panels), figsize=(6 * len(panels), 3.8), squeeze=False)
    for ax, (title, panel_keys) in zip(axes[0], panels):
        for run in runs:
            for key in panel_keys:
                plot_series(ax, run.records, "train", key, key if len(runs) == 1 else f"{run.name}: {key}")
        finish(ax, title)
    save(fig, path)


def write_report(out: Path, report: dict, runs: list[RunLog]) -> list[Path]:
    """Writes the files the report names into `out`; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.md").write_text(markdown(report))
    plot_curves(runs, out / report["files"]["curves"])
    written = [out / "report.md", out / "report.json", out / report["files"]["curves"]]
    if report["files"]["gates"]:
        plot_gates(runs, out / report["files"]["gates"])
        written.append(out / report["files"]["gates"])
    return written
