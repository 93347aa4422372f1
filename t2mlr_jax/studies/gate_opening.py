"""Why the default `gated` mixer stays closed on the CPU demo, and what opens it (issue 11, item 5).

The demo (configs/s5_retrieval_t2mlr.py:cpu: S5-retrieval parity, 64 x 4 model, 800 steps of exact
token-by-token training, AdamW LR 3e-3, 5% warmup, cosine) is trained once per variant and seed (default:
42, the config's and the demo's) with the framework's own trainer; the ReZero gammas' trajectories
(tanh γ_rec, tanh γ_in, as the trainer logs them) are compared with the final evaluation. Every gated
variant sets the mixer, the gate LR multiplier and γ_rec's init explicitly, so the table does not depend
on what the cpu preset currently chooses:

  gated            the gated mixer with the release's S5 recipe (γ = 0 at init, gate LR x1)
  gated_lr10       ... gate LR multiplier 10 (optimizer.gate_lr_multiplier scales every mixer parameter:
                   the gammas, the gate projections and W_rec, as the release's is_boosted_param_name does)
  gated_lr100      ... gate LR multiplier 100 (the release's GSM8K setting)
  gated_gamma001   ... γ_rec = 0.01 at init (model.recurrence.gamma_recurrent_init)
  gated_gamma01    ... γ_rec = 0.1 at init: the cpu preset's recipe
  constant_weight  the zoo's constant-weight mixer, (1 - α) x + α R with α = 0.5 (the demo's former mixer)
  transformer      the parameter-matched transformer baseline

  python -m experiments.gate_opening                         # --preset=cpu: gated, gated_lr10, gated_lr100,
                                                             # gated_gamma01, constant_weight, transformer
  python -m experiments.gate_opening --variants=gated,gated_gamma01,constant_weight --seeds=0,1,2,3,42 \\
      --out=runs/gate_opening_seeds                          # how often each opens, over seeds
  python -m experiments.gate_opening --preset=tiny --out=/tmp/go   # seconds: a 32-wide model (tests)

Resumable, run by run: each (variant, seed) is one main.py workdir, <out>/<variant>/seed<k>; a rerun skips
the runs whose summary.json exists and resumes one stopped mid-training from its checkpoints (the trainer
does); <out>/.jax_cache keeps compiled steps. `python tools/report.py <out>/<variant>` reports a variant's
seeds (gates.png included).

Writes, in --out (default runs/gate_opening_<preset>):
  results.json             per variant: its recipe (arch, mixer, gate LR multiplier, γ_rec init, LR, the
                           config changes), a summary over its seeds (how many opened, exact match mean /
                           min / max) and per run: final tanh γ_rec / γ_in, the largest |tanh γ_rec|, the
                           first logged step at which |tanh γ_rec| > 0.1 (null: never), final train loss /
                           accuracy, final eval metrics (exact match, token accuracy, loss, exact match by
                           length and beyond the trained lengths) and the logged tanh γ series
  results.md               the per-variant and per-run tables; also printed
  gamma_trajectories.png   tanh γ_rec and tanh γ_in vs step, one line per gated run
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import NamedTuple

from t2mlr_jax.analysis.plots import finish, save, subplots
from t2mlr_jax.analysis.run_logs import load_runs, read_json
from t2mlr_jax.config.cli import OneLineParser, fail
from t2mlr_jax.studies import ROOT, runner
from t2mlr_jax.studies.analysis_common import setup_jax, train_run
from t2mlr_jax.studies.benchmarks.report import environment, markdown_table

COMMAND = "python -m experiments.gate_opening"
CONFIG = ROOT / "configs" / "s5_retrieval_t2mlr.py"
GAMMA_REC, GAMMA_IN = "tanh_rezero_gamma_recurrent_gate", "tanh_rezero_gamma_input_gate"
OPEN_AT = 0.1  # |tanh γ_rec| above this counts as open


class Variant(NamedTuple):
    label: str
    changes: dict  # dotted config paths -> values, over the preset


GATED = {
    "model.recurrence.mixer": "gated",
    "optimizer.gate_lr_multiplier": 1.0,
    "model.recurrence.gamma_recurrent_init": 0.0,
}
LR, GAMMA = "optimizer.gate_lr_multiplier", "model.recurrence.gamma_recurrent_init"
VARIANTS = {
    "gated": Variant("gated, release recipe (γ = 0 at init)", GATED),
    "gated_lr10": Variant("gated, gate LR ×10", {**GATED, LR: 10.0}),
    "gated_lr100": Variant("gated, gate LR ×100 (release GSM8K)", {**GATED, LR: 100.0}),
    "gated_gamma001": Variant("gated, γ_rec = 0.01 at init", {**GATED, GAMMA: 0.01}),
    "gated_gamma01": Variant("gated, γ_rec = 0.1 at init", {**GATED, GAMMA: 0.1}),
    "constant_weight": Variant(
        "constant_weight mixer (α = 0.5)", {"model.recurrence.mixer": "constant_weight"}
    ),
    "transformer": Variant("parameter-matched transformer", {"arch": "transformer"}),
}
# Per preset: the configs/s5_retrieval_t2mlr.py preset, changes over it, and the default variants.
PRESETS = {
    "cpu": {
        "preset": "cpu",
        "changes": {"train.log_every": 10},
        "variants": ("gated", "gated_lr10", "gated_lr100", "gated_gamma01", "constant_weight", "transformer"),
    },
    # A 32-wide, 3-layer model (one-layer recurrent block 1..1), batch 16, 16 eval examples: seconds a
    # variant; for tests and quick probes, not for conclusions.
    "tiny": {
        "preset": "cpu",
        "changes": {
            "model.hidden_size": 32,
            "model.num_layers": 3,
            "model.num_heads": 2,
            "model.num_kv_heads": 2,
            "model.mlp_dim": 64,
            "train.batch_size": 16,
            "train.steps": 40,
            "train.log_every": 2,
            "train.checkpoint_every": 1000,
            "train.progress": False,
            "eval.num_examples": 16,
            "eval.batch_size": 16,
        },
        "variants": ("gated", "gated_gamma01"),
    },
}


def _names(text: str) -> list[str]:
    wanted = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [v for v in wanted if v not in VARIANTS]
    if unknown or not wanted:
        raise argparse.ArgumentTypeError(
            f"unknown variants {unknown or 'empty list'}; choose from {', '.join(VARIANTS)}"
        )
    return [v for v in VARIANTS if v in wanted]  # table order


def _seeds(text: str) -> list[int]:
    try:
        seeds = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers, got {text!r}") from None
    if not seeds or seeds[0] < 0:
        raise argparse.ArgumentTypeError(f"expected seeds >= 0, got {text!r}")
    return seeds


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = OneLineParser(prog=COMMAND, description=__doc__)
    parser.add_argument(
        "--preset",
        choices=list(PRESETS),
        default="cpu",
        help="cpu: the demo's 64 x 4 model and 800 steps (~2 min a run on an idle 2-core machine); "
        "tiny: a 32-wide, 3-layer model for a few steps (tests)",
    )
    parser.add_argument(
        "--variants", type=_names, help="comma list of " + ",".join(VARIANTS) + " (default: the preset's)"
    )
    parser.add_argument("--steps", type=int, help="train.steps of every run (default: the preset's)")
    parser.add_argument(
        "--seeds",
        type=_seeds,
        help="comma list of config.seed values, one run each (default: the config's own, 42: the demo's)",
    )
    parser.add_argument("--out", type=Path, help="output directory (default runs/gate_opening_<preset>)")
    return parser.parse_args(argv)


# ---------------------------------------------------------------------------------------------- configs


def variant_config(name: str, seed: int, preset: str, steps: int | None):
    """configs/s5_retrieval_t2mlr.py at the preset, with the preset's and the variant's changes; checked
    (architecture) before anything is trained."""
    from t2mlr_jax.architectures import build_architecture
    from t2mlr_jax.config.edit import config_module, set_path
    from t2mlr_jax.experiment import resolve

    config = config_module(CONFIG).get_config(PRESETS[preset]["preset"])
    config.seed = seed
    for path, value in {**PRESETS[preset]["changes"], **VARIANTS[name].changes}.items():
        set_path(config, path, value)
    if steps is not None:
        config.train.steps = steps
    build_architecture(resolve(config))
    return config


def train_one(name: str, seed: int, config, out: Path) -> dict:
    """Train (or resume, or skip) one run into <out>/<variant>/seed<k>: what results.json keeps of it (its
    summary.json read as a rerun reads it), or the summary with "stopped_by" when it was stopped midway."""
    from t2mlr_jax.storage.workdir import SUMMARY

    workdir = out / name / f"seed{seed}"
    try:
        summary = train_run(config, workdir)
    except (ValueError, KeyError, FileNotFoundError) as e:
        fail(e)
    if "stopped_by" in summary:
        return summary
    return run_result(seed, config, workdir, read_json(workdir / SUMMARY))  # JSON keys, as a rerun reads it


# ---------------------------------------------------------------------------------------------- reading


def series(records: list[dict], key: str) -> dict:
    """The logged train values of `key` in step order (a step logged twice keeps its last line)."""
    by_step = {
        r["step"]: r[key]
        for r in records
        if r["split"] == "train" and isinstance(r.get(key), (int, float)) and math.isfinite(r[key])
    }
    steps = sorted(by_step)
    return {"step": steps, "value": [by_step[s] for s in steps]}


def first_open_step(gamma_rec: dict, threshold: float = OPEN_AT) -> int | None:
    """The first logged step at which |tanh γ_rec| exceeds `threshold`; None if it never does."""
    return next((s for s, v in zip(gamma_rec["step"], gamma_rec["value"]) if abs(v) > threshold), None)


def exact_match_beyond(by_length: dict, trained_max: int) -> float | None:
    """Exact match over the evaluated lengths longer than any seen in training (count-weighted)."""
    rows = [
        (b["exact_match"], b["count"])
        for n, b in by_length.items()
        if str(n).isdigit() and int(n) > trained_max
    ]
    total = sum(c for _, c in rows)
    return sum(e * c for e, c in rows) / total if total else None


def recipe(config) -> dict:
    return {
        "arch": config.arch,
        "mixer": config.model.recurrence.mixer if config.arch == "t2mlr" else None,
        "gate_lr_multiplier": float(config.optimizer.gate_lr_multiplier),
        "gamma_recurrent_init": float(config.model.recurrence.gamma_recurrent_init),
        "lr": float(config.optimizer.lr),
        "schedule": f"{config.optimizer.schedule}, warmup {config.optimizer.warmup_ratio:g}",
    }


def run_result(seed: int, config, workdir: Path, summary: dict) -> dict:
    """What results.json keeps of one trained run, read from its metrics.jsonl and summary.json."""
    (run,) = load_runs(workdir)
    rec, inp = series(run.records, GAMMA_REC), series(run.records, GAMMA_IN)
    train = [r for r in run.records if r["split"] == "train"]
    final = train[-1] if train else {}
    evaluation = summary.get("eval", {})
    by_length = evaluation.get("by_length", {})
    return {
        "seed": seed,
        "workdir": str(workdir),
        "params": summary.get("num_params"),
        "steps": summary.get("steps"),
        "final_tanh_gamma_rec": rec["value"][-1] if rec["value"] else None,
        "final_tanh_gamma_in": inp["value"][-1] if inp["value"] else None,
        "max_abs_tanh_gamma_rec": max(map(abs, rec["value"]), default=None),
        "first_step_open": first_open_step(rec),
        "final_train_loss": final.get("loss"),
        "final_train_accuracy": final.get("accuracy"),
        "eval": {
            "exact_match": evaluation.get("exact_match"),
            "token_accuracy": evaluation.get("token_accuracy"),
            "loss": evaluation.get("loss"),
            "exact_match_beyond_training": exact_match_beyond(
                by_length, int(config.data.options.get("max_actions", 0))
            ),
            "exact_match_by_length": {str(n): b["exact_match"] for n, b in by_length.items()},
        },
        "series": {"tanh_gamma_rec": rec, "tanh_gamma_in": inp},
    }


def variant_summary(runs: list[dict]) -> dict:
    """Over a variant's seeds: how many opened (|tanh γ_rec| > 0.1 at some logged step) and exact match."""
    matches = [r["eval"]["exact_match"] for r in runs if r["eval"]["exact_match"] is not None]
    gated = [r for r in runs if r["final_tanh_gamma_rec"] is not None]
    return {
        "seeds": [r["seed"] for r in runs],
        "opened": sum(r["first_step_open"] is not None for r in gated) if gated else None,
        "exact_match_mean": sum(matches) / len(matches) if matches else None,
        "exact_match_min": min(matches, default=None),
        "exact_match_max": max(matches, default=None),
    }


# ---------------------------------------------------------------------------------------------- report


def _num(value, fmt: str = ".3f") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    return f"{value:{fmt}}"


def runs_table(results: dict) -> str:
    header = [
        "Variant",
        "Seed",
        "tanh γ_rec (final)",
        "max \\|tanh γ_rec\\|",
        "first step \\|tanh γ_rec\\| > 0.1",
        "tanh γ_in (final)",
        "train loss (final)",
        "exact match",
        "token acc.",
        "exact match beyond training",
    ]
    rows = []
    for name, v in results.items():
        for r in v["runs"]:
            gated = r["final_tanh_gamma_rec"] is not None
            rows.append(
                [
                    f"`{name}`",
                    r["seed"],
                    _num(r["final_tanh_gamma_rec"], "+.4f"),
                    _num(r["max_abs_tanh_gamma_rec"], ".4f"),
                    "never" if gated and r["first_step_open"] is None else _num(r["first_step_open"], "d"),
                    _num(r["final_tanh_gamma_in"], "+.4f"),
                    _num(r["final_train_loss"], ".4f"),
                    _num(r["eval"]["exact_match"]),
                    _num(r["eval"]["token_accuracy"]),
                    _num(r["eval"]["exact_match_beyond_training"]),
                ]
            )
    return markdown_table(header, rows)


def variants_table(results: dict) -> str:
    header = ["Variant", "Recipe", "Seeds", "Opened", "exact match: mean (min–max)"]
    rows = []
    for name, v in results.items():
        s = v["summary"]
        opened = "—" if s["opened"] is None else f"{s['opened']}/{len(s['seeds'])}"
        spread = f"{_num(s['exact_match_mean'])} ({_num(s['exact_match_min'])}–{_num(s['exact_match_max'])})"
        rows.append([f"`{name}`", v["label"], ",".join(map(str, s["seeds"])), opened, spread])
    return markdown_table(header, rows)


def render(meta: dict, results: dict) -> str:
    config = f"configs/s5_retrieval_t2mlr.py:{PRESETS[meta['preset']]['preset']}"
    return "\n".join(
        [
            f"# Opening the gated mixer on the S5 demo ({meta['preset']})",
            "",
            f"`{meta['command']}` on {meta['device']}, jax {meta['jax']}; wall time "
            f"{meta['wall_seconds']:.0f} s (this invocation). {config} with the preset's changes, "
            f"{meta['steps']} steps, seeds {','.join(map(str, meta['seeds']))}.",
            "",
            variants_table(results),
            "",
            runs_table(results),
            "",
            "- Opened: runs whose \\|tanh γ_rec\\| exceeded 0.1 at some logged step; `—`: no ReZero gammas.",
            "- tanh γ as the trainer logs it (train lines, one per logging window). Exact match beyond "
            "training: the evaluated lengths longer than any trained one.",
            "- Curves: gamma_trajectories.png (tanh γ_rec and tanh γ_in vs step, one line per gated run).",
        ]
    )


def plot(results: dict, path: Path) -> None:
    fig, axes = subplots(1, 2, figsize=(13, 4.6))
    for ax, key, title in zip(axes, ("tanh_gamma_rec", "tanh_gamma_in"), ("tanh γ_rec", "tanh γ_in")):
        for i, (name, v) in enumerate(results.items()):
            for j, r in enumerate(v["runs"]):
                s = r["series"][key]
                if s["step"]:
                    style = ("-", "--", ":", "-.")[j % 4]
                    ax.plot(s["step"], s["value"], style, color=f"C{i}", label=f"{name} (seed {r['seed']})")
        ax.axhline(0.0, color="grey", lw=0.8)
        if key == "tanh_gamma_rec":
            for level in (OPEN_AT, -OPEN_AT):
                ax.axhline(level, color="grey", lw=0.6, ls=":")
        finish(ax, title)
    save(fig, path)


def write_results(out: Path, meta: dict, results: dict) -> str:
    (out / "results.json").write_text(json.dumps({"meta": meta, "variants": results}, indent=1))
    markdown = render(meta, results)
    (out / "results.md").write_text(markdown + "\n")
    plot(results, out / "gamma_trajectories.png")
    return markdown


# ---------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> dict:
    from t2mlr_jax.experiment import resolve

    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    names = args.variants or list(PRESETS[args.preset]["variants"])
    if args.seeds is None:
        from t2mlr_jax.config.edit import config_module

        args.seeds = [int(config_module(CONFIG).get_config(PRESETS[args.preset]["preset"]).seed)]
    out = args.out or Path(f"runs/gate_opening_{args.preset}")
    started = time.time()
    if args.steps is not None and args.steps < 1:
        fail(f"--steps must be >= 1, got {args.steps}")
    try:  # every config built and checked before anything is compiled
        configs = {
            (name, seed): variant_config(name, seed, args.preset, args.steps)
            for name in names
            for seed in args.seeds
        }
        from t2mlr_jax.train.build_data import build_data_source

        build_data_source(resolve(next(iter(configs.values()))))
    except (ValueError, KeyError, FileNotFoundError) as e:
        fail(e)
    out.mkdir(parents=True, exist_ok=True)
    setup_jax(out)
    meta = {
        **environment(args.preset, COMMAND, argv),
        "cpus": os.cpu_count(),
        "seeds": args.seeds,
        "steps": next(iter(configs.values())).train.steps,
        "variants": names,
    }
    study = runner.Study(
        list(configs),
        lambda name, seed: train_one(name, seed, configs[name, seed], out),
        tag=lambda name, seed: f"{name} (seed {seed})",
        report=lambda name, seed, r, seconds: (
            f"{name} (seed {seed}): tanh γ_rec {_num(r['final_tanh_gamma_rec'], '+.4f')}, exact match "
            f"{_num(r['eval']['exact_match'])} ({seconds:.0f} s)"
        ),
        desc="runs",
    )
    by_seed, seconds, stopped = runner.run(study)
    runs = {name: list(by_seed[name].values()) for name in names}
    meta["wall_seconds"] = round(time.time() - started, 1)
    meta["run_seconds"] = {f"{name}/seed{seed}": s for (name, seed), s in seconds.items()}
    meta["complete"] = not stopped
    results = {
        name: {
            "variant": name,
            "label": VARIANTS[name].label,
            "recipe": {**recipe(configs[name, args.seeds[0]]), "changes": VARIANTS[name].changes},
            "summary": variant_summary(runs[name]),
            "runs": runs[name],
        }
        for name in names
        if runs[name]
    }
    if not results:
        return {"meta": meta, "variants": {}}
    markdown = write_results(out, meta, results)
    print(markdown)
    print(f"\nwrote {out / 'results.json'}, {out / 'results.md'}, {out / 'gamma_trajectories.png'}")
    return {"meta": meta, "variants": results}
