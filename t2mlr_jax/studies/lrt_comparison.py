"""Depth versus time (../shared/papers/002): train rows of the comparison, once per seed, and tabulate them
like the paper's Tables 1-3 and Figure 3.

Each row is a preset of configs/lrt_comparison.py (`<row>,<scale>`), trained by the framework's own
trainer (t2mlr_jax.train.trainer) into <out>/<row>/seed<S>/ and scored in bits per byte with the exact
sequential recurrence and with the training-time parallel refinement: thought rows at their largest trained
K, and every row trained with sampled K (tt1, tt2, no_cross, no_kv) also at each K of --eval_thoughts
(Table 2), the same weights evaluated again with config.eval.thoughts = K.

  python -m experiments.lrt_comparison --preset=study                     # the seeded study, all 19 rows
  python -m experiments.lrt_comparison --preset=cpu --rows=vanilla1x,tt2  # one seed, two rows
  python -m experiments.lrt_comparison --preset=paper --rows=tt1 --train_path=... --eval_path=... \\
      --tokenizer=...                                                     # the paper's sizes (accelerators)

--preset=study is the protocol (t2mlr_jax.studies.protocol): a 512-token BPE of the training plays
(trained into <out>/tokenizer), seeds 0, 1, 2, the recipe fixed before any row ran (STUDY_RECIPE: one LR
multiplier over nanochat's rates, chosen on vanilla1x alone by experiments/lr_sweep.py; warmup, clipping,
one Muon weight decay for every depth), every row at the same steps (Tables 1-3's protocol) and Figure 3's
rows also FLOP-matched to the double-depth transformer's steps (or --flop_budget), all on the same capped
unique text (data.train_tokens: what the row reading least of the stream in the study's steps reads, of
all rows, whatever --rows selects; the others revisit it), and the papers' claims (lrt_comparison_rows.CLAIMS)
judged by their paired differences over seeds, each under its own table's protocol. Before training it writes
<out>/preregistration.json (every run's recipe, the claims and their margins, the commit) and judges no
claim whose runs were trained under another recipe. A run whose training loss exceeds ln V after step 10
has diverged: counted and shown, never dropped. It runs its rows in 2 worker processes (--workers; each is
this command with --shard=I/N, its output in <out>/worker<I>.log), then tabulates. Resumable per row and
seed: a finished one is read back, one stopped mid-training resumes from its checkpoints, per-K and
parallel evaluations are kept in its folder. Raw text is tokenized once into token stores in <out>/data;
<out>/.jax_cache keeps compiled steps.

Writes, in --out (default runs/lrt_comparison_<preset>):
  rows.jsonl    one line per (row, seed) as it finishes
  preregistration.json  written before training: recipes, claims, margins, seeds, commit
  results.json  per row: label, arch, params (and over vanilla1x), training FLOPs, steps, unique and read
                tokens, vocabulary targets, head share, decode blocks per token, BPB (exact, parallel, the
                training log's) and at every evaluated K, whether each seed diverged, means and per seed;
                the claims judged per table (refused ones with the reason); the commit
  results.md    Table 1 (params, decode blocks, FLOPs, BPB ± 95%), Table 2 (BPB vs evaluation K), Table 3
                (ablations against tt1), the protocol per row, the claims; also printed
  results.png   BPB vs training FLOPs, BPB vs evaluation K for the sampled-K rows, each claim's interval
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from tqdm import tqdm

from t2mlr_jax.config.cli import OneLineParser, fail
from t2mlr_jax.studies import runner
from t2mlr_jax.studies.analysis_common import (
    comma_list,
    pretokenize,
    setup_jax,
    study_tokenizer,
)
from t2mlr_jax.studies.lrt_comparison_report import bpb_text, write_results
from t2mlr_jax.studies.lrt_comparison_rows import (
    CLAIMS,
    FIGURE3,
    PARITY_MARGIN,
    REFERENCE,
    ROWS,
    ROWS_CONFIG,
    base_row,
    check_data_paths,
    flop_matched,
    paper_order,
    row_config,
)
from t2mlr_jax.studies.lrt_comparison_runs import comparisons, row_result, run_seed
from t2mlr_jax.studies.preregistration import PREREGISTRATION
from t2mlr_jax.studies.recipe_rule import SWEEP_SEEDS, count_diverged
from t2mlr_jax.train.local_workers import parse_shard, shard_of

COMMAND = "python -m experiments.lrt_comparison"


def _ints(text: str) -> tuple[int, ...]:
    values = comma_list(text)
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"thought counts must be >= 0, got {text!r}")
    return values


def _shard_arg(text: str) -> tuple[int, int]:
    try:
        return parse_shard(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def resolve_rows(text: str) -> list[str]:
    wanted = [r.strip() for r in text.split(",") if r.strip()]
    unknown = ROWS_CONFIG.unknown_rows(wanted)
    if unknown or not wanted:
        raise SystemExit(f"error: --rows: unknown {unknown or 'empty list'}; choose from {', '.join(ROWS)}")
    return paper_order(set(wanted))


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = OneLineParser(prog=COMMAND, description=__doc__)
    parser.add_argument(
        "--preset",
        choices=list(ROWS_CONFIG.SCALES),
        default="cpu",
        help="the scale of every row: cpu (offline Shakespeare, 2 layers x 64 wide, ~30 min for all rows on "
        "2 cores) or paper (nanochat(16), 2048-token rows; give --train_path/--eval_path/--tokenizer)",
    )
    parser.add_argument(
        "--rows",
        help=f"comma list of {','.join(ROWS)} (default: every row)",
    )
    parser.add_argument("--out", help="output directory (default runs/lrt_comparison_<preset>)")
    parser.add_argument(
        "--flop_budget",
        type=float,
        default=0.0,
        help="> 0: each row trains for budget / its expected FLOPs per step (config.train.flop_budget)",
    )
    parser.add_argument(
        "--eval_thoughts",
        type=_ints,
        default=(0, 1, 2, 3, 4),
        help="K values at which every row trained with sampled K is also evaluated (Table 2)",
    )
    parser.add_argument(
        "--seeds",
        type=_ints,
        help="config.seed values, each row trained once per seed (default: 0,1,2 for the study, else 0)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        help="processes training rows side by side, each a --shard of this command (default: 2 for the "
        "study, where one process keeps ~1.3 of 2 CPU cores busy and compiles on one, else 1)",
    )
    parser.add_argument(
        "--shard",
        type=_shard_arg,
        help="I/N: train and evaluate only the rows in shard I of N (every N-th row from the I-th, all "
        "seeds) and write no tables; --workers runs its shards this way, a rerun without it tabulates",
    )
    parser.add_argument(
        "--probe",
        action="store_true",
        help="the recipe rule's stability probe (recipe_rule.stable_multiplier) of the study: each run at "
        "the sweep seeds (default 100,101), writing only <out>/probe.json (its diverged runs), no claims",
    )
    parser.add_argument("--steps", type=int, help="train.steps of every row (default: the preset's)")
    parser.add_argument("--batch_size", type=int, help="train.batch_size (default: the preset's)")
    parser.add_argument("--eval_examples", type=int, help="eval.num_examples (default: the preset's)")
    parser.add_argument("--eval_batch_size", type=int, help="eval.batch_size (default: the preset's)")
    parser.add_argument("--train_path", help="data.train_path (the paper preset has none)")
    parser.add_argument("--eval_path", help="data.eval_path (the paper preset has none)")
    parser.add_argument("--tokenizer", help="data.tokenizer (the paper preset has none)")
    return parser.parse_args(argv)


def resolved(config):
    """The typed config a run trains (with train.flop_budget, the steps it affords: resolve's). Its
    architecture is built on the way, so that a row that cannot be built fails before anything compiles."""
    from t2mlr_jax.architectures import build_architecture
    from t2mlr_jax.experiment import resolve

    typed = resolve(config)
    build_architecture(typed)
    return typed


def run_configs(rows: list[str], args: argparse.Namespace, budget: float) -> dict:
    """Each run's config by name: every row at the comparison's steps (or --flop_budget outside a study),
    and with a Figure 3 `budget` its rows also FLOP-matched (`flop_matched(row)`)."""
    configs = {row: row_config(row, args) for row in rows}
    for row in FIGURE3 if budget else ():
        if row in rows:
            configs[flop_matched(row)] = row_config(row, args)
            configs[flop_matched(row)].train.flop_budget = budget
    return configs


def equal_data(args: argparse.Namespace) -> int:
    """The unique training tokens every row gets (Tables 1-3's protocol): what the row reading least of the
    stream reads in its steps, over every row of the comparison, so that any --rows trains on the same
    text, the other rows revisiting it as epochs. Figure 3's FLOP-matched runs draw on the same capped text:
    one that reads less in its fewer steps sees less of it (the double-depth transformer about twice the
    one-thought LRT's unique text, as in the paper), and none reads text the others could not (an uncapped
    run would read further plays, and their order by seed: a second source of variance)."""
    from t2mlr_jax.train.trainer import tokens_read

    typed = [resolved(c) for c in run_configs(list(ROWS), args, 0.0).values()]
    return min(tokens_read(t, t.train.steps)["train_tokens_read"] for t in typed)


def run_dir(out: Path, name: str, seed: int) -> Path:
    """Where a run trains: <out>/<row>/seed<S>, a FLOP-matched one under <out>/flops/."""
    row = base_row(name)
    return out / ("flops" if name != row else "") / row / f"seed{seed}"


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    study = args.preset == "study"
    rows = resolve_rows(args.rows or ",".join(ROWS))
    out = Path(args.out or f"runs/lrt_comparison_{args.preset}")
    seeds = args.seeds or (SWEEP_SEEDS if args.probe else (0, 1, 2) if study else (0,))
    workers = (2 if study else 1) if args.workers is None else args.workers
    started = time.time()
    try:  # every config built and checked before anything is compiled
        if workers < 1:
            raise ValueError(f"--workers must be at least 1, got {args.workers}")
        if args.probe and not study:
            raise ValueError("--probe probes the study's recipe: give --preset=study")
        if study and not args.tokenizer:
            out.mkdir(parents=True, exist_ok=True)
            args.tokenizer = study_tokenizer(out, ROWS_CONFIG.STUDY_VOCAB)
        check_data_paths(row_config(rows[0], args), args.preset)
        from t2mlr_jax.architectures import build_architecture, flops_per_step
        from t2mlr_jax.config.convert import to_dict
        from t2mlr_jax.experiment import resolve
        from t2mlr_jax.studies.preregistration import commit, preregister, recipe, unregistered
        from t2mlr_jax.studies.protocol import check_seeds
        from t2mlr_jax.train.build_data import build_data_source

        budget = 0.0
        if study:  # Tables 1-3 at equal steps; Figure 3's budget: the reference's steps at its FLOPs per step
            if not args.probe:
                check_seeds(seeds)
            budget, args.flop_budget = args.flop_budget, 0.0
            if not budget:
                typed = resolve(row_config(ROWS_CONFIG.STUDY_REFERENCE, args))
                budget = typed.train.steps * flops_per_step(typed, build_architecture(typed))
        configs = run_configs(rows, args, budget)
        build_data_source(resolve(configs[rows[0]]))  # paths and tokenizer
        reference = build_architecture(
            resolve(row_config(REFERENCE, args))
        ).num_params()  # Table 1's normaliser
        unique = equal_data(args) if study else 0
        typed = {}
        for name, config in configs.items():
            config.data.train_tokens = unique
            try:  # here, not in a worker minutes later
                typed[name] = resolved(config)
            except ValueError as e:
                raise ValueError(f"{name}: the budget's equal-data cap is below one batch: {e}") from None
        # a FLOP-matched run at its row's own steps (the reference) is that row's run
        aliases = {
            name: base_row(name)
            for name in configs
            if name != base_row(name) and typed[name].train.steps == typed[base_row(name)].train.steps
        }
        trained = [name for name in configs if name not in aliases]
        out.mkdir(parents=True, exist_ok=True)
        if args.preset != "paper":
            for config in configs.values():
                pretokenize(config, out / "data")
        registration = None
        if study and not args.shard and not args.probe:
            registration = preregister(
                out,
                {name: recipe(to_dict(typed[name])) for name in trained},
                [c for claims in CLAIMS.values() for c in claims],
                {
                    "command": " ".join([COMMAND, *argv]),
                    "seeds": list(seeds),
                    "rows": rows,
                    "flop_budget": budget,
                    "parity_margin_bpb": PARITY_MARGIN,
                    "recipe": ROWS_CONFIG.STUDY_RECIPE,
                },
            )
    except (ValueError, KeyError, FileNotFoundError, subprocess.CalledProcessError) as e:
        fail(e)
    setup_jax(out)  # the compilation cache; no warning that a CPU cannot donate the step's buffers
    import jax

    device = jax.devices()[0]
    workers = 1 if args.shard else min(len(trained), workers)
    meta = {
        "preset": args.preset,
        "command": " ".join([COMMAND, *argv]),
        "commit": registration["commit"] if registration else commit(),
        "device": f"{device.platform}: {device.device_kind}",
        "jax": jax.__version__,
        "python": platform.python_version(),
        "rows": rows,
        "seeds": list(seeds),
        "workers": workers,
        "flop_budget": args.flop_budget,
        "figure3_budget": budget or None,
        "budget_reference": ROWS_CONFIG.STUDY_REFERENCE if study else None,
        "train_tokens_unique": unique or None,
        "tokenizer": configs[rows[0]].data.tokenizer,
        "vocab_size": configs[rows[0]].model.vocab_size,
        "bpb_masking": configs[rows[0]].eval.bpb_masking,
        "eval_thoughts": list(args.eval_thoughts),
        "reference_params": reference,
        "recipe": ROWS_CONFIG.STUDY_RECIPE if study else None,
        "cpus": os.cpu_count(),
    }
    journal = out / "rows.jsonl"  # a line per (run, seed) trained or evaluated, by whichever process
    logged = len(journal.read_text().splitlines()) if journal.exists() else 0
    if workers > 1:
        extra = [f"--tokenizer={configs[rows[0]].data.tokenizer}"] if configs[rows[0]].data.tokenizer else []
        unit_dirs = [run_dir(out, name, seed) for seed in seeds for name in trained]
        if not runner.run_shards("experiments.lrt_comparison", argv, workers, out, unit_dirs, extra):
            tqdm.write("stopped by a signal; rerun to resume")
            return {"meta": meta, "rows": {}}

    def run_unit(name: str, seed: int) -> runner.Ran:
        config = configs[name].copy_and_resolve_references()
        config.seed = seed
        own_k = args.eval_thoughts if name in rows else ()  # a FLOP-matched run: at its own K only
        try:
            result = run_seed(name, config, run_dir(out, name, seed), own_k)
        except (ValueError, KeyError, FileNotFoundError) as e:
            fail(e)
        fresh = result.pop("new", True)  # anything trained or evaluated now (a stopped run has no "new")
        return runner.Ran(result, fresh)

    def report(name: str, seed: int, result: dict, seconds: float) -> str:
        return f"{name} seed {seed}: BPB {bpb_text(result['bpb'])} ({seconds:.0f} s)"

    units = runner.grid(shard_of(trained, args.shard), seeds, seed_major=True)  # a table per seed first
    by_name = runner.run(runner.Study(units, run_unit, journal, report=report, desc="runs x seeds")).results
    if args.shard:
        return {"meta": meta, "rows": {}}  # the tables are the whole command's
    meta["wall_seconds"] = round(time.time() - started, 1)
    by_name |= {alias: by_name[base] for alias, base in aliases.items()}
    done = [name for name in configs if len(by_name[name]) == len(seeds)]
    spent = {}  # seconds of the runs trained or evaluated in this invocation, by whichever process
    for line in journal.read_text().splitlines()[logged:] if journal.exists() else []:
        record = json.loads(line)
        spent[record["row"]] = spent.get(record["row"], 0.0) + record["seconds"]
    meta["row_seconds"] = {name: round(spent[name], 1) for name in done if name in spent}
    results = {name: row_result(name, configs[name], by_name[name], reference) for name in done}
    if not results:
        return {"meta": meta, "rows": {}}
    meta["diverged"] = count_diverged(
        {
            f"{name}/seed{s}": r["diverged"]
            for name in done
            if name not in aliases
            for s, r in by_name[name].items()
        }
    )
    if args.probe:  # divergence only: the probe's seeds judge nothing
        probe = {"multiplier": ROWS_CONFIG.STUDY_LR_MULTIPLIER, **meta}
        (out / "probe.json").write_text(json.dumps(probe, indent=1))
        bad = meta["diverged"]
        print(f"probe at x{probe['multiplier']:g}: {bad['diverged']} of {bad['of']} diverged {bad['runs']}")
        return {"meta": meta, "rows": {}}
    judged = {}
    if study and len(done) == len(configs):
        from t2mlr_jax.studies.protocol import check_equal_data

        check_equal_data({f"{r} seed {s}": v for r in rows for s, v in results[r]["seeds"].items()})
        registration = registration or json.loads((out / PREREGISTRATION).read_text())
        refused = lambda name: unregistered(
            registration, aliases.get(name, name), [run_dir(out, aliases.get(name, name), s) for s in seeds]
        )
        judged = comparisons(results, refused)
    markdown = write_results(out, meta, results, judged)
    print(markdown)
    return {"meta": meta, "rows": results, "claims": judged}
