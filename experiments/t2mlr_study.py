#!/usr/bin/env python
"""T²MLR's headline claims at CPU scale, measured with the protocol (t2mlr_jax.analysis.protocol): every row
trained with three seeds (init and data order) by the framework's own trainer, each claim judged by the
paired difference to its baseline with its 95% interval, the seed-to-seed noise floor beside it.

Parts (--parts, default all three):
  s5      S5-retrieval's parity (configs/s5_retrieval_t2mlr.py:cpu, 800 steps, the same steps for every
          row): T²MLR against the parameter-matched transformer and the parameter-matched looped
          transformer (the whole stack twice); exact match on held-out rows of up to 10 actions, longer than
          any trained on (paper Sec. 3.2: T²MLR solves S5-retrieval where transformers fail)
  table6  Table 6 on the same task, where the gate opens (γ_rec starts at 0.1; its trajectory is plotted):
          T²MLR trained with the Jacobi forward (D 8 < the 26-token training rows, B 4) against the exact
          recurrence with full backpropagation through time (s5's T²MLR runs), both evaluated exactly, and
          the Jacobi-trained weights evaluated with the Jacobi forward too; eval loss. The paper claims no
          difference (gaps of 0.001-0.0045 nats): a claim of none is reproduced only when the whole interval
          lies within ±0.0045
  text    small text pretraining (configs/smollm135m_t2mlr.py:cpu's 4 x 64 model, the gate starting as in
          s5) on the training plays through a 512-token BPE trained on them: T²MLR against the
          parameter-matched transformer at the same steps (Table 6's vanilla column) and against the
          transformer given T²MLR's training FLOPs (Table 12's compute-matched baseline), all three on the
          same unique text (the FLOP-matched one revisits it: epochs); held-out bits per byte (nanochat's
          masking) on The Tempest and The Winter's Tale

  python -m experiments.t2mlr_study                       # all three parts, ~35 min on 2 cores
  python -m experiments.t2mlr_study --parts=s5 --seeds=0,1,2,3,4

Resumable: every (row, seed) trains into <out>/<row>/seed<s>/ (a finished one is read back, a stopped one
resumes from its checkpoints). Writes, in --out (default runs/t2mlr_study):
  rows.jsonl    one line per (row, seed) as it finishes
  results.json  meta, each row's figures per seed, each part's comparison (rows, claims, verdicts)
  results.md    one table per part (also printed)
  results.png   each part's rows with their intervals, and tanh γ_rec over training per T²MLR run
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import NamedTuple

from tqdm import tqdm

from experiments.analysis_common import (
    ROOT,
    OneLineParser,
    comma_list,
    evaluated,
    fail,
    pretokenize,
    setup_jax,
    study_tokenizer,
    train_run,
)
from t2mlr_jax import cpu_runtime
from t2mlr_jax.analysis.plots import interval_rows, subplots
from t2mlr_jax.analysis.protocol import Claim, check_seeds, compare, markdown
from t2mlr_jax.analysis.run_logs import metric_trajectory
from t2mlr_jax.config.edit import config_module, set_path
from t2mlr_jax.storage.workdir import SUMMARY

COMMAND = "python -m experiments.t2mlr_study"
S5, TEXT = "configs/s5_retrieval_t2mlr.py:cpu", "configs/smollm135m_t2mlr.py:cpu"
TEXT_VOCAB = 512
GAMMA = "tanh_rezero_gamma_recurrent_gate"  # the trainer's log of tanh γ_rec
OPEN = 0.1  # |tanh γ_rec| beyond which the recurrent path counts as opened
TABLE6_MARGIN = 0.0045  # nats: the paper's largest Jacobi-vs-exact gap (Table 6, 1B)
# The text part: 4 x 64 on 64-token rows, 8 per step; the gate starts as in S5's cpu preset (γ_rec 0.1:
# from 0 it stays shut at this budget, experiments/gate_opening.py).
TEXT_SETTINGS = {
    "model.vocab_size": TEXT_VOCAB,
    "model.recurrence.gamma_recurrent_init": 0.1,
    "eval.bpb_masking": "nanochat",
    "eval.require_bpb": True,
    "train.steps": 400,
    "train.batch_size": 8,
    "train.log_every": 10,
    "eval.num_examples": 128,
    "eval.batch_size": 64,
}


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
    extra: tuple[str, ...] = ()  # "<row>@<eval>" values judged besides the rows


JACOBI_EVAL = {"t2mlr.eval_mode": "jacobi"}
S5_EVERY = {"train.eval_every": 100}  # exact match over training (how soon each seed learns parity)
ROWS = {
    "s5_t2mlr": Row(S5, S5_EVERY, "T²MLR (exact recurrence, full BPTT)"),
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
            "t2mlr.forward_mode": "jacobi",
            "model.recurrence.d_forward": 8,
            "model.recurrence.d_backward": 4,
        },
        "T²MLR (Jacobi training, D 8, B 4)",
        {"jacobi": JACOBI_EVAL},
    ),
    "text_t2mlr": Row(TEXT, TEXT_SETTINGS, "T²MLR (1, 2), Jacobi D 4 B 2"),
    "text_transformer": Row(TEXT, {**TEXT_SETTINGS, "arch": "transformer"}, "transformer, param-matched"),
    "text_transformer_flops": Row(
        TEXT, {**TEXT_SETTINGS, "arch": "transformer"}, "transformer, param-matched, T²MLR's training FLOPs"
    ),
}
PARTS = {
    "s5": Part(
        ("s5_t2mlr", "s5_transformer", "s5_looped"),
        "exact_match",
        "S5-retrieval parity: exact match on held-out rows of 1-10 actions (higher is better)",
        (
            Claim("s5_t2mlr", "s5_transformer", "solves S5-retrieval, transformers fail (Sec. 3.2)", 1),
            Claim("s5_t2mlr", "s5_looped", "T²MLR above looped baselines (Table 2)", 1),
        ),
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
        ("s5_t2mlr_jacobi@jacobi",),
    ),
    "text": Part(
        ("text_t2mlr", "text_transformer", "text_transformer_flops"),
        "bpb",
        "Small text pretraining: held-out bits per byte (lower is better)",
        (
            Claim("text_t2mlr", "text_transformer", "loss 3.9083 vs 3.9514 (−0.043, Table 6)", -1),
            Claim("text_transformer_flops", "text_t2mlr", "avg. acc. 45.30 vs 44.14 (Table 12)", -1),
        ),
    ),
}


def _parts(text: str) -> tuple[str, ...]:
    parts = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = [p for p in parts if p not in PARTS]
    if unknown or not parts:
        raise argparse.ArgumentTypeError(
            f"unknown parts {unknown or 'none given'}; choose from {list(PARTS)}"
        )
    return parts


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = OneLineParser(
        prog=COMMAND, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--parts", type=_parts, default=tuple(PARTS), help=f"comma list of {','.join(PARTS)}")
    parser.add_argument("--seeds", type=comma_list, default=(0, 1, 2), help="config.seed values (at least 3)")
    parser.add_argument("--out", default="runs/t2mlr_study", help="output directory")
    return parser.parse_args(argv)


def row_config(name: str, seed: int, settings: dict):
    """The row's config at `seed`, with the study's own `settings` (its tokenizer, text, budgets) on top."""
    row = ROWS[name]
    path, _, presets = row.config.partition(":")
    config = config_module(ROOT / path).get_config(presets or None)
    for dotted, value in {**row.overrides, **settings}.items():
        set_path(config, dotted, value)
    config.seed = seed
    return config


def text_settings(out: Path, rows: list[str]) -> dict:
    """Per text row: the study's tokenizer and plays (as token stores), the same unique text for all (what
    T²MLR reads in its steps), and the FLOP-matched transformer's budget (T²MLR's training FLOPs)."""
    from configs.recipes import shakespeare_split
    from t2mlr_jax.architectures import build_architecture
    from t2mlr_jax.experiment import resolve
    from t2mlr_jax.train.trainer import flops_per_step, tokens_read

    train, heldout = shakespeare_split()
    common = {
        "data.tokenizer": study_tokenizer(out, TEXT_VOCAB),
        "data.train_path": train,
        "data.eval_path": heldout,
    }
    t2mlr = row_config("text_t2mlr", 0, common)
    pretokenize(t2mlr, out / "data")  # points its paths at the token stores
    common |= {"data.train_path": t2mlr.data.train_path, "data.eval_path": t2mlr.data.eval_path}
    typed = resolve(t2mlr)
    common["data.train_tokens"] = tokens_read(typed, typed.train.steps)["train_tokens_read"]
    budget = typed.train.steps * flops_per_step(typed, build_architecture(typed))
    return {
        row: {**common, **({"train.flop_budget": budget} if row == "text_transformer_flops" else {})}
        for row in rows
    }


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


def render(meta: dict, results: dict, judged: dict) -> str:
    lines = [
        "# T²MLR's claims at CPU scale",
        "",
        f"`{meta['command']}`: seeds {', '.join(map(str, meta['seeds']))}; "
        f"wall time {meta['wall_seconds']:.0f} s.",
    ]
    for part_name, comparison in judged.items():
        part = PARTS[part_name]
        lines += ["", f"## {part.title}", ""]
        lines += [f"- `{row}`: {ROWS[row].label}" for row in part.rows]
        lines += ["", markdown(comparison, part.metric, 4)]
        steps = {row: sorted({r["steps"] for r in results[row].values()}) for row in part.rows}
        lines += ["Steps: " + ", ".join(f"`{row}` {'/'.join(map(str, s))}" for row, s in steps.items()) + "."]
        first = {row: next(iter(results[row].values())) for row in part.rows}
        if any(f["train_flops"] for f in first.values()):
            lines += [
                "Training FLOPs / unique tokens / tokens read: "
                + "; ".join(
                    f"`{row}` {f['train_flops']:.3g} / {f['train_tokens_unique'] or '—'} / "
                    f"{f['train_tokens_read'] or '—'}"
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


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    out = Path(args.out)
    started = time.time()
    rows = list(
        dict.fromkeys(
            row
            for part in args.parts
            for row in PARTS[part].rows + tuple(e.split("@")[0] for e in PARTS[part].extra)
        )
    )
    try:  # every config built and checked before anything is compiled
        check_seeds(args.seeds)
        out.mkdir(parents=True, exist_ok=True)
        text_rows = [row for row in rows if row.startswith("text_")]
        settings = {row: {} for row in rows} | (text_settings(out, text_rows) if text_rows else {})
        from t2mlr_jax.experiment import resolve
        from t2mlr_jax.train.build_data import build_data_source
        from t2mlr_jax.train.trainer import Run

        for row in rows:
            config = row_config(row, args.seeds[0], settings[row])
            typed = resolve(config)
            Run(typed, out / row / f"seed{args.seeds[0]}", build_data_source(typed), config.arch)
    except (ValueError, KeyError, FileNotFoundError) as e:
        fail(e)
    setup_jax(out)
    results = {row: {} for row in rows}
    for seed, row in tqdm([(s, r) for s in args.seeds for r in rows], desc="rows x seeds", file=sys.stderr):
        unit, workdir = time.time(), out / row / f"seed{seed}"
        fresh = not (workdir / SUMMARY).exists()
        result = run_seed(row, row_config(row, seed, settings[row]), workdir)
        if "stopped_by" in result:
            tqdm.write(f"{row}: stopped by {result['stopped_by']} at step {result['step']}; rerun to resume")
            return {}
        results[row][seed] = result
        if not fresh:
            continue
        with open(out / "rows.jsonl", "a") as f:
            f.write(
                json.dumps({"row": row, "seed": seed, "seconds": round(time.time() - unit, 1), **result})
                + "\n"
            )
    judged = {part: compare(values_of(PARTS[part], results), PARTS[part].claims) for part in args.parts}
    meta = {"command": " ".join([COMMAND, *argv]), "seeds": list(args.seeds), "parts": list(args.parts),
            "wall_seconds": round(time.time() - started, 1)}  # fmt: skip
    payload = {"meta": meta, "rows": results, "claims": judged}
    (out / "results.json").write_text(json.dumps(payload, indent=1, default=str))
    text = render(meta, results, judged)
    (out / "results.md").write_text(text)
    plot(judged, results, out / "results.png")
    print(text)
    return payload


if __name__ == "__main__":
    cpu_runtime.tune()
    main()
