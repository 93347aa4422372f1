"""T²MLR's headline claims at CPU scale, measured with the protocol (t2mlr_jax.studies.protocol): every row
trained with several seeds (init and data order) by the framework's own trainer, each claim judged by the
paired difference to its baseline with its 95% interval, the seed-to-seed noise floor beside it. Every
recipe was fixed by the rule (t2mlr_jax.studies.recipe_rule, docs/recipes.md) before any row ran: one LR
multiplier swept on the parameter-matched transformer alone, halved while a probe of every row on the sweep
seeds diverges (--probe).

Parts (--parts, default all three):
  s5      S5-retrieval's parity (`make demo`'s recipe, configs/s5_retrieval_t2mlr.py:demo: 1500 steps,
          seeds 0-2): T²MLR against the parameter-matched transformer and the parameter-matched looped
          transformer (the whole stack twice); exact match on held-out rows of up to 10 actions, longer than
          any trained on (paper Sec. 3.2: T²MLR solves S5-retrieval where transformers fail)
  table6  Table 6 on the same task (seeds 0-2): T²MLR trained with the Jacobi forward (D 8 < the 26-token
          training rows, B 4) against the exact recurrence with full backpropagation through time (s5's
          T²MLR runs), both evaluated exactly, and the Jacobi-trained weights evaluated with the Jacobi
          forward too; eval loss. The paper claims no difference (gaps of 0.001-0.0045 nats): a claim of
          none is reproduced only when the whole interval lies within ±0.0045
  text    small text pretraining (configs/t2mlr_text_study.py, seeds 0-4): 8 layers with the middle quarter
          recurrent, 256-token rows, 20 training tokens per parameter, T²MLR Jacobi-trained at D 16, B 4
          (evaluated exactly and with the Jacobi forward) against the parameter-matched transformer at the
          same steps on the same text (Table 6's vanilla column); held-out bits per byte (nanochat's masking)
          on 256 rows of The Tempest and The Winter's Tale

  python -m experiments.t2mlr_study                       # all three parts, under an hour on 2 cores
  python -m experiments.t2mlr_study --parts=s5 --seeds=0,1,2,3,4
  python -m experiments.t2mlr_study --probe               # the rule's stability probe: seeds 100, 101

Before training it writes <out>/preregistration.json (every row's recipe, the claims and their margins, the
commit) and judges no claim whose runs were trained under another recipe. A run whose training loss exceeds
ln V after step 10 has diverged: counted and shown, never dropped. Its runs train in 2 worker processes
(--workers; each this command with --shard=I/N, its output in <out>/worker<I>.log), then it tabulates.
Resumable: every (row, seed) trains into <out>/<row>/seed<s>/ (a finished one is read back, a stopped one
resumes from its checkpoints). Writes, in --out (default runs/t2mlr_study):
  preregistration.json  written before training
  rows.jsonl    one line per (row, seed) as it finishes
  results.json  meta (with the commit and the diverged runs), each row's figures per seed, each part's
                comparison (rows, claims, verdicts)
  results.md    one table per part (also printed)
  results.png   each part's rows with their intervals, and tanh γ_rec over training per T²MLR run
  probe.json    with --probe only (and nothing else): the diverged runs at the sweep seeds
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

from tqdm import tqdm

from t2mlr_jax.analysis.plots import interval_rows, subplots
from t2mlr_jax.analysis.run_logs import metric_trajectory
from t2mlr_jax.config.cli import OneLineParser, fail
from t2mlr_jax.config.edit import config_module, set_path
from t2mlr_jax.storage.workdir import SUMMARY
from t2mlr_jax.studies import ROOT, runner
from t2mlr_jax.studies.analysis_common import (
    comma_list,
    evaluated,
    pretokenize,
    setup_jax,
    study_tokenizer,
    train_run,
)
from t2mlr_jax.studies.preregistration import PREREGISTRATION, commit, preregister, recipe, unregistered
from t2mlr_jax.studies.protocol import Claim, check_seeds, markdown
from t2mlr_jax.studies.recipe_rule import SWEEP_SEEDS, count_diverged, diverged
from t2mlr_jax.train.local_workers import parse_shard, shard_of

COMMAND = "python -m experiments.t2mlr_study"
S5, TEXT = "configs/s5_retrieval_t2mlr.py:demo", "configs/t2mlr_text_study.py"
GAMMA = "tanh_rezero_gamma_recurrent_gate"  # the trainer's log of tanh γ_rec
OPEN = 0.1  # |tanh γ_rec| beyond which the recurrent path counts as opened
TABLE6_MARGIN = 0.0045  # nats: the paper's largest Jacobi-vs-exact gap (Table 6, 1B)


class Row(NamedTuple):
    config: str  # a config file under the repo root with its presets
    overrides: dict  # dotted config paths -> values
    label: str
    evals: dict = {}  # name -> overrides: the trained weights evaluated again another way


class Part(NamedTuple):
    rows: tuple[str, ...]
    metric: str  # the summary's eval metric
    title: str
    claims: tuple[Claim, ...]
    seeds: tuple[int, ...]  # the part's seeds unless --seeds gives others
    extra: tuple[str, ...] = ()  # "<row>@<eval>" values judged besides the rows


JACOBI_EVAL = {"t2mlr.eval_mode": "jacobi"}
S5_EVERY = {"train.eval_every": 250}  # exact match over training (how soon each seed learns parity)
ROWS = {
    "s5_t2mlr": Row(S5, {**S5_EVERY, "arch": "t2mlr"}, "T²MLR (exact recurrence, full BPTT)"),
    "s5_transformer": Row(
        S5, {**S5_EVERY, "arch": "transformer", "baseline.param_match": True}, "transformer, param-matched"
    ),
    "s5_looped": Row(
        S5,
        {
            **S5_EVERY,
            "arch": "looped",
            "looped.start": 0,
            "looped.end": -1,
            "looped.repeats": 2,
            "baseline.param_match": True,
        },
        "looped transformer x2, param-matched",
    ),
    "s5_t2mlr_jacobi": Row(
        S5,
        {
            **S5_EVERY,
            "arch": "t2mlr",
            "t2mlr.forward_mode": "jacobi",
            "model.recurrence.d_forward": 8,
            "model.recurrence.d_backward": 4,
        },
        "T²MLR (Jacobi training, D 8, B 4)",
        {"jacobi": JACOBI_EVAL},
    ),
    "text_t2mlr": Row(
        f"{TEXT}:t2mlr", {}, "T²MLR (4, 5) of 8, Jacobi-trained D 16 B 4, exact eval", {"jacobi": JACOBI_EVAL}
    ),
    "text_transformer": Row(f"{TEXT}:transformer", {}, "transformer, param-matched"),
}
S5_SEEDS, TEXT_SEEDS = (0, 1, 2), (0, 1, 2, 3, 4)
PARTS = {
    "s5": Part(
        ("s5_t2mlr", "s5_transformer", "s5_looped"),
        "exact_match",
        "S5-retrieval parity: exact match on held-out rows of 1-10 actions (higher is better)",
        (
            Claim("s5_t2mlr", "s5_transformer", "solves S5-retrieval, transformers fail (Sec. 3.2)", 1),
            Claim("s5_t2mlr", "s5_looped", "T²MLR above looped baselines (Table 2)", 1),
        ),
        S5_SEEDS,
    ),
    "table6": Part(
        ("s5_t2mlr", "s5_t2mlr_jacobi"),
        "loss",
        "Table 6: Jacobi- vs exact-trained T²MLR, eval loss (nats)",
        (
            Claim(
                "s5_t2mlr_jacobi", "s5_t2mlr", "3.9073 vs 3.9083 (−0.0010): no difference", 0, TABLE6_MARGIN
            ),
            Claim(
                "s5_t2mlr_jacobi@jacobi",
                "s5_t2mlr_jacobi",
                "3.9073 vs 3.9073: no difference",
                0,
                TABLE6_MARGIN,
            ),
        ),
        S5_SEEDS,
        ("s5_t2mlr_jacobi@jacobi",),
    ),
    "text": Part(
        ("text_t2mlr", "text_transformer"),
        "bpb",
        "Small text pretraining: held-out bits per byte (lower is better)",
        (Claim("text_t2mlr", "text_transformer", "loss 3.9083 vs 3.9514 (−0.043, Table 6)", -1),),
        TEXT_SEEDS,
        ("text_t2mlr@jacobi",),
    ),
}
TEXT_VOCAB = config_module(ROOT / TEXT).VOCAB


def _parts(text: str) -> tuple[str, ...]:
    parts = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = [p for p in parts if p not in PARTS]
    if unknown or not parts:
        raise argparse.ArgumentTypeError(
            f"unknown parts {unknown or 'none given'}; choose from {list(PARTS)}"
        )
    return parts


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = OneLineParser(prog=COMMAND, description=__doc__)
    parser.add_argument("--parts", type=_parts, default=tuple(PARTS), help=f"comma list of {','.join(PARTS)}")
    parser.add_argument(
        "--seeds", type=comma_list, help="config.seed values of every part (default: each part's own)"
    )
    parser.add_argument(
        "--probe",
        action="store_true",
        help="the rule's stability probe: every row at the sweep seeds (default 100,101), writing only "
        "<out>/probe.json (its diverged runs), no claims",
    )
    parser.add_argument("--workers", type=int, default=2, help="processes training runs side by side")
    parser.add_argument("--shard", help="I/N: train only every N-th run from the I-th, tabulate nothing")
    parser.add_argument("--out", default="runs/t2mlr_study", help="output directory")
    return parser.parse_args(argv)


def part_seeds(args: argparse.Namespace, part: str) -> tuple[int, ...]:
    return args.seeds or (SWEEP_SEEDS if args.probe else PARTS[part].seeds)


def row_config(name: str, seed: int, settings: dict):
    """The row's config at `seed`, with the study's own `settings` (its tokenizer and token stores) on top."""
    row = ROWS[name]
    path, _, presets = row.config.partition(":")
    config = config_module(ROOT / path).get_config(presets or None)
    for dotted, value in {**row.overrides, **settings}.items():
        set_path(config, dotted, value)
    config.seed = seed
    return config


def text_settings(out: Path) -> dict:
    """The text rows' data: the study's BPE (trained into <out>/tokenizer) and the plays as token stores in
    <out>/data; both rows read the same text in the same order (the same steps, rows and seed)."""
    settings = {"data.tokenizer": study_tokenizer(out, TEXT_VOCAB)}
    config = row_config("text_t2mlr", 0, settings)
    pretokenize(config, out / "data")  # points its paths at the token stores
    return settings | {"data.train_path": config.data.train_path, "data.eval_path": config.data.eval_path}


def run_seed(name: str, config, workdir: Path) -> dict:
    """Train (or read back) one row at one seed, evaluate it the row's other ways; its figures."""
    from t2mlr_jax.experiment import resolve
    from t2mlr_jax.train.build_data import build_data_source

    summary = train_run(config, workdir)
    if "stopped_by" in summary:
        return summary
    result = {
        "params": summary["num_params"],
        "steps": summary["steps"],
        **{
            k: summary.get(k)
            for k in ("flops_per_step", "train_flops", "train_tokens_read", "train_tokens_unique")
        },
        "eval": {k: v for k, v in summary["eval"].items() if isinstance(v, (int, float))},
        "diverged": diverged(metric_trajectory(workdir, "train", "loss"), config.model.vocab_size),
    }
    for evaluation, overrides in ROWS[name].evals.items():
        metrics, _ = evaluated(
            config, workdir, build_data_source(resolve(config), train=False), evaluation, overrides
        )
        result[f"eval@{evaluation}"] = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
    if config.train.eval_every:  # S5's rows: evaluated during training
        result["exact_match_over_training"] = metric_trajectory(workdir, "eval", "exact_match")
    gamma = metric_trajectory(workdir, "train", GAMMA)
    if gamma:
        opened = [step for step, g in gamma if abs(g) > OPEN]
        result |= {
            "gamma": gamma,
            "gamma_final": gamma[-1][1],
            "gamma_opened_at": opened[0] if opened else None,
        }
    return result


def values_of(part: Part, results: dict) -> dict:
    """{row (or row@eval): {seed: metric}} for the part's rows."""
    values = {row: {s: r["eval"][part.metric] for s, r in results[row].items()} for row in part.rows}
    for extra in part.extra:
        row, evaluation = extra.split("@")
        values[extra] = {s: r[f"eval@{evaluation}"][part.metric] for s, r in results[row].items()}
    return values


def judge(part: Part, results: dict, refused_runs) -> dict:
    """The part's comparison, the claims one of whose rows `refused_runs` names (trained under another
    recipe than the pre-registered one) listed under "refused" with why instead of judged."""
    return runner.judge(values_of(part, results), part.claims, lambda name: refused_runs(name.split("@")[0]))


def render(meta: dict, results: dict, judged: dict) -> str:
    bad = meta["diverged"]
    lines = [
        "# T²MLR's claims at CPU scale",
        "",
        f"`{meta['command']}` at commit {meta['commit']}; wall time {meta['wall_seconds']:.0f} s "
        f"({meta['workers']} workers). Diverged runs (training loss > ln V after step 10): "
        f"{bad['diverged']} of {bad['of']}" + (f" ({', '.join(bad['runs'])})" if bad["runs"] else "") + ".",
    ]
    for part_name, comparison in judged.items():
        part = PARTS[part_name]
        seeds = ", ".join(map(str, meta["seeds"][part_name]))
        lines += ["", f"## {part.title}", "", f"Seeds {seeds}."]
        lines += [f"- `{row}`: {ROWS[row].label}" for row in part.rows]
        lines += ["", markdown(comparison, part.metric, 4)]
        for claim in comparison["claims"]:  # what the interval can resolve; for BPB, relative to its level
            half = (claim["difference"]["high"] - claim["difference"]["low"]) / 2
            level = abs(comparison["rows"][claim["baseline"]]["mean"])
            relative = part.metric == "bpb" and level  # a fraction of an accuracy or a ~0 loss says nothing
            lines += [
                f"`{claim['row']}` vs `{claim['baseline']}` resolves ±{half:.4f}"
                + (f" ({100 * half / level:.1f}% of the baseline's {part.metric})." if relative else ".")
            ]
        for claim, why in comparison.get("refused", {}).items():
            lines += [f"Not judged, `{claim}`: trained under another recipe than the registered one: {why}."]
        steps = {row: sorted({r["steps"] for r in results[row].values()}) for row in part.rows}
        lines += ["Steps: " + ", ".join(f"`{row}` {'/'.join(map(str, s))}" for row, s in steps.items()) + "."]
        first = {row: next(iter(results[row].values())) for row in part.rows}
        lines += [
            "Parameters / training FLOPs / tokens read: "
            + "; ".join(
                f"`{row}` {f['params']:,} / {f['train_flops'] or 0:.3g} / {f['train_tokens_read'] or '—'}"
                for row, f in first.items()
            )
            + "."
        ]
        gates = {row: rs for row in part.rows if "gamma_final" in (rs := results[row])[next(iter(rs))]}
        for row, rs in gates.items():
            opened = [r["gamma_opened_at"] for r in rs.values()]
            lines += [
                f"`{row}` gate: final tanh γ_rec "
                + ", ".join(f"{r['gamma_final']:+.3f}" for r in rs.values())
                + f"; first step with |tanh γ_rec| > {OPEN}: "
                + ", ".join("never" if s is None else str(s) for s in opened)
                + " (per seed)."
            ]
    return "\n".join(lines) + "\n"


def plot(judged: dict, results: dict, path: Path) -> None:
    panels = len(judged) + 2
    fig, axes = subplots(1, panels, figsize=(5.5 * panels, 4.5), squeeze=False)
    for ax, (part_name, comparison) in zip(axes[0], judged.items()):
        metric = f"{PARTS[part_name].metric} (mean, 95%)"
        rows = comparison["rows"]
        interval_rows(ax, list(rows), list(rows.values()), xlabel=metric, title=part_name)
    gate, learned = axes[0][-2:]
    for ax, key in ((gate, "gamma"), (learned, "exact_match_over_training")):
        for row, by_seed in results.items():
            for seed, r in by_seed.items():
                if r.get(key):
                    steps, values = zip(*r[key])
                    ax.plot(steps, values, lw=0.8, label=f"{row} s{seed}")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=6)
    gate.axhline(OPEN, color="gray", ls=":", lw=0.8)
    gate.set(xlabel="step", ylabel="tanh γ_rec", title="recurrent gate over training")
    learned.set(xlabel="step", ylabel="exact match", title="S5: held-out exact match over training")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


# The costliest runs first, so that sharding every N-th run deals them out evenly between the workers.
COST_ORDER = ("text_t2mlr", "text_transformer", "s5_t2mlr_jacobi", "s5_t2mlr", "s5_looped", "s5_transformer")


def units_of(args: argparse.Namespace) -> list[tuple[str, int]]:
    """Every (row, seed) the parts train, once each (a row in two parts trains once per seed)."""
    units = {
        (row.split("@")[0], seed)
        for part in args.parts
        for row in PARTS[part].rows + PARTS[part].extra
        for seed in part_seeds(args, part)
    }
    return sorted(units, key=lambda u: (COST_ORDER.index(u[0]), u[1]))


def run_dir(out: Path, row: str, seed: int) -> Path:
    return out / row / f"seed{seed}"


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    out = Path(args.out)
    started = time.time()
    units = units_of(args)
    rows = list(dict.fromkeys(row for row, _ in units))
    registration = None
    try:  # every config built and checked before anything is compiled
        shard = parse_shard(args.shard) if args.shard else None
        if args.workers < 1:
            raise ValueError(f"--workers must be at least 1, got {args.workers}")
        if not args.probe:
            for part in args.parts:
                check_seeds(part_seeds(args, part))
        out.mkdir(parents=True, exist_ok=True)
        text = text_settings(out) if any(row.startswith("text_") for row in rows) else {}
        settings = {row: text if row.startswith("text_") else {} for row in rows}
        from t2mlr_jax.config.convert import to_dict
        from t2mlr_jax.experiment import resolve
        from t2mlr_jax.train.build_data import build_data_source
        from t2mlr_jax.train.trainer import Run

        recipes = {}
        for row in rows:
            typed = resolve(row_config(row, 0, settings[row]))
            recipes[row] = recipe(to_dict(typed))
        for row, seed in shard_of(units, shard):
            typed = resolve(row_config(row, seed, settings[row]))
            Run(typed, run_dir(out, row, seed), build_data_source(typed), typed.arch)
        if not args.probe and not shard:
            registration = preregister(
                out,
                recipes,
                [c for part in args.parts for c in PARTS[part].claims],
                {"command": " ".join([COMMAND, *argv]), "parts": list(args.parts),
                 "seeds": {part: list(part_seeds(args, part)) for part in args.parts}},
            )  # fmt: skip
    except (ValueError, KeyError, FileNotFoundError, subprocess.CalledProcessError) as e:
        fail(e)
    setup_jax(out)
    workers = 1 if shard else min(args.workers, len(units))
    dirs = [run_dir(out, *u) for u in units]
    if workers > 1 and not runner.run_shards("experiments.t2mlr_study", argv, workers, out, dirs):
        tqdm.write("stopped by a signal; rerun to resume")
        return {}

    def run_unit(row: str, seed: int) -> runner.Ran:
        workdir = run_dir(out, row, seed)
        fresh = not (workdir / SUMMARY).exists()
        return runner.Ran(run_seed(row, row_config(row, seed, settings[row]), workdir), fresh)

    study = runner.Study(shard_of(units, shard), run_unit, out / "rows.jsonl")
    results, _, stopped = runner.run(study)
    if stopped or shard:
        return {}
    meta = {
        "command": " ".join([COMMAND, *argv]),
        "commit": registration["commit"] if registration else commit(),
        "parts": list(args.parts),
        "seeds": {part: list(part_seeds(args, part)) for part in args.parts},
        "workers": workers,
        "wall_seconds": round(time.time() - started, 1),
        "diverged": count_diverged({f"{row}/seed{s}": r["diverged"] for row, rs in results.items()
                                    for s, r in rs.items()}),
    }  # fmt: skip
    if args.probe:  # divergence only: the probe's seeds judge nothing
        (out / "probe.json").write_text(json.dumps(meta, indent=1))
        bad = meta["diverged"]
        print(f"probe: {bad['diverged']} of {bad['of']} runs diverged {bad['runs']}")
        return {"meta": meta}
    registration = registration or json.loads((out / PREREGISTRATION).read_text())
    judged = {}
    for name in args.parts:
        part, seeds = PARTS[name], part_seeds(args, name)
        in_part = {row: {s: r for s, r in rs.items() if s in seeds} for row, rs in results.items()}
        refused = lambda row: unregistered(registration, row, [run_dir(out, row, s) for s in seeds])
        judged[name] = judge(part, in_part, refused)
    payload = {"meta": meta, "rows": results, "claims": judged}
    runner.write_json(out / "results.json", payload)
    text = render(meta, results, judged)
    (out / "results.md").write_text(text)
    plot(judged, results, out / "results.png")
    print(text)
    return payload
