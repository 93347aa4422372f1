"""A training run summarized without TensorBoard: report.md and report.json (how the run ended, the run's
identity, final and best metrics, checkpoints, throughput), curves.png (loss, BPB, accuracy vs step)
and, for runs that log gates (T²MLR), gates.png (mean gate activations and ReZero gammas vs step).
tools/report.py is its CLI.

A workdir is one run (metrics.jsonl at its top) or a multi-architecture comparison (one run per
sub-folder holding a metrics.jsonl). Everything is read and checked before anything is written, so bad
input leaves no partial report.

How a run ended comes from its sessions.jsonl (t2mlr_jax/storage/workdir.py): each training session's
"start" line and, unless it was killed, its "end" line saying how. Runs older than that record fall back
on metrics.jsonl, where a "nonfinite" line after the last train line is the NaN guard's stop. A
summary.json older than the last session's start is an earlier session's and is ignored, with a note.
"""

from __future__ import annotations

import json
import math
import os
import socket
import statistics
import time
from pathlib import Path
from typing import Any, NamedTuple

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from t2mlr_jax.storage.workdir import (  # noqa: E402
    CHECKPOINTS,
    METRICS,
    RUN_CONFIG,
    SESSIONS,
    SUMMARY,
    lock_owner,
    read_sessions,
    saved_steps,
)

# Metrics with a direction get a "best" value; the others (lr, grad_norm, gates) only a final one.
LOWER_IS_BETTER = ("loss", "perplexity", "bpb")
HIGHER_IS_BETTER = ("accuracy", "token_accuracy", "exact_match")
# curves.png panels: (title, train key, eval key); train logs per-token accuracy as "accuracy".
CURVES = (
    ("loss", "loss", "loss"),
    ("bits per byte", "bpb", "bpb"),
    ("token accuracy", "accuracy", "token_accuracy"),
)
GATE_PANELS = (("gate means (gate/*)", "gate/"), ("ReZero gammas (*gamma*)", "gamma"))


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


# ---------------------------------------------------------------------------------------------
# How the run ended: sessions.jsonl, else metrics.jsonl.


def clock(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def sessions_of(records: list[dict]) -> list[dict]:
    """sessions.jsonl's lines paired: {"start", "end", "how"} per session; a session without its "end"
    line (the next "start" came first, or none did) was killed, or still trains."""
    sessions = []
    for record in records:
        if record.get("event") == "start":
            sessions.append({"start": record, "end": None, "how": "killed"})
        elif record.get("event") == "end" and sessions and sessions[-1]["end"] is None:
            sessions[-1].update(end=record, how=record.get("how", "?"))
    return sessions


def still_training(path: Path, start: dict) -> bool:
    """Whether the session of this "start" line trains now: workdir/train.lock names its process, alive on
    this host. A killed owner leaves the file behind; an owner writing it leaves it unreadable a moment."""
    owner, session = lock_owner(path), (start.get("pid"), start.get("host"))
    if owner is None or session[1] != socket.gethostname() or (owner["pid"], owner["host"]) != session:
        return False
    try:
        os.kill(owner["pid"], 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        pass
    return True


def nonfinite_text(record: dict | None) -> str:
    if record is None:
        return f"stopped at NaN (the non-finite step's line is not in {METRICS})"
    return (
        f"stopped at NaN: step {record['step']} was non-finite (loss {fmt(record.get('loss', '?'))}, "
        f"gradient norm {fmt(record.get('grad_norm', '?'))}) and not applied"
    )


def resumable_from(latest: int | None) -> str:
    return f"resumable from the checkpoint at step {latest}" if latest is not None else "no checkpoint saved"


def session_text(how: str, session: dict, last_step: int, latest: int | None, stop: dict | None) -> str:
    """The last session's ending as a line."""
    if how == "finished":
        return f"finished at step {session['end']['step']}"
    if how == "nonfinite":
        return f"{nonfinite_text(stop)}; {resumable_from(latest)}"
    if how in ("SIGTERM", "SIGINT"):
        step = session["end"]["step"]
        return f"stopped by {how} at step {step} after saving, resumable (rerun the same command)"
    if how == "running":
        return f"running (pid {session['start']['pid']} on this host), last logged step {last_step}"
    if how == "killed":
        return f"killed (no end record in {SESSIONS}) after step {last_step}; {resumable_from(latest)}"
    return f"ended as {how!r} at step {session['end']['step']}"


def resume_count(sessions: list[dict]) -> int:
    """Sessions that started from a checkpoint."""
    return sum(1 for s in sessions if s["start"].get("step", 0) > 0)


def resumed_text(sessions: list[dict]) -> str:
    resumes = resume_count(sessions)
    if not resumes:
        return ""
    earlier = ", ".join(s["how"] for s in sessions[:-1])
    return f"; resumed {resumes} time{'s' if resumes != 1 else ''} (earlier sessions: {earlier})"


def run_ending(path: Path, records: list[dict], latest: int | None) -> dict:
    """How the run ended, from sessions.jsonl or (runs from before it) metrics.jsonl: {"how" (one of
    workdir.ENDINGS, "killed", "running", "unknown"), "text" (one line), "resumes", "sessions", "nonfinite"
    (the line of the step that stopped it), "skipped_nonfinite" (steps nan_policy=skip skipped)}."""
    nonfinite = [r for r in records if r["split"] == "nonfinite"]
    last_step = max((r["step"] for r in records), default=0)
    sessions = sessions_of(read_sessions(path))
    if sessions:
        last = sessions[-1]
        how = "running" if last["end"] is None and still_training(path, last["start"]) else last["how"]
        stop = nonfinite[-1] if how == "nonfinite" and nonfinite else None
        last_step = max(last_step, last["start"].get("step", 0))
        text = session_text(how, last, last_step, latest, stop) + resumed_text(sessions)
    else:
        last_train = max((i for i, r in enumerate(records) if r["split"] == "train"), default=-1)
        stop = nonfinite[-1] if nonfinite and records.index(nonfinite[-1]) > last_train else None
        how = "nonfinite" if stop else "unknown"
        text = (
            f"{nonfinite_text(stop)}; {resumable_from(latest)}"
            if stop
            else f"ending unknown (no {SESSIONS}: a run from before it), last logged step {last_step}"
        )
    skipped = len(nonfinite) - (stop is not None)
    if skipped:
        text += f"; {skipped} non-finite step{'s' if skipped != 1 else ''} skipped (train.nan_policy=skip)"
    return {
        "how": how,
        "text": text,
        "resumes": resume_count(sessions) if sessions else None,
        "sessions": sessions,
        "nonfinite": stop,
        "skipped_nonfinite": skipped,
    }


def current_summary(path: Path, sessions: list[dict]) -> tuple[dict | None, str | None]:
    """(summary.json, None), or (None, why it was ignored) when it is older than the last session's start:
    an earlier session wrote it, and the last one has not (it stopped, was killed, or still trains)."""
    summary = read_json(path / SUMMARY)
    started = sessions[-1]["start"].get("time") if sessions else None
    if summary is None or started is None:
        return summary, None
    written = (path / SUMMARY).stat().st_mtime
    if written >= started:
        return summary, None
    return None, (
        f"{SUMMARY} ignored: written {clock(written)}, before the last session started ({clock(started)}), "
        "so it is an earlier session's"
    )


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
    }


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


def fmt(value: Any) -> str:
    """Numbers short, strings as they are, anything else as JSON (true, null, {})."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return json.dumps(value)
    return f"{value:,}" if isinstance(value, int) else f"{value:.6g}"


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


def finish(ax, title: str) -> None:
    ax.set(title=title, xlabel="step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize="small")


def plot_curves(runs: list[RunLog], path: Path) -> None:
    """One panel per metric that was logged; per run one colour, train solid, eval dashed."""
    logged = {k for run in runs for r in run.records for k in r}
    panels = [c for c in CURVES if {c[1], c[2]} & logged] or list(CURVES[:1])
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8), squeeze=False)
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
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 3.8), squeeze=False)
    for ax, (title, panel_keys) in zip(axes[0], panels):
        for run in runs:
            for key in panel_keys:
                plot_series(ax, run.records, "train", key, key if len(runs) == 1 else f"{run.name}: {key}")
        finish(ax, title)
    save(fig, path)


def save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
