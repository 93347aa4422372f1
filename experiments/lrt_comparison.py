#!/usr/bin/env python
"""Depth versus time (../shared/papers/002): train every row of the comparison and tabulate it like the
paper's Tables 1-3 and Figure 3.

Each row is a preset of configs/lrt_comparison.py (`<row>,<scale>`), trained by the framework's own
trainer (t2mlr_jax.train.trainer) into <out>/<row>/ and scored in bits per byte with the exact sequential
recurrence: thought rows at their largest trained K, and every row trained with sampled K (lrt.thoughts
with more than one K: tt1, tt2, no_cross, no_kv) also at each K of --eval_thoughts (Table 2), the same
weights evaluated again with config.eval.thoughts = K.

  python experiments/lrt_comparison.py --preset=cpu                       # every row, CPU-sized
  python experiments/lrt_comparison.py --preset=cpu --rows=vanilla1x,tt2  # two rows
  python experiments/lrt_comparison.py --preset=paper --rows=tt1 --train_path=... --eval_path=... \\
      --tokenizer=...                                                     # the paper's sizes (accelerators)

Resumable, row by row: a rerun skips the rows whose <out>/<row>/summary.json exists, resumes a row
stopped mid-training from its checkpoints (the trainer does), and reuses the per-K evaluations already in
<out>/<row>/eval_thoughts<K>.json. --flop_budget=<FLOPs> gives every row the steps that spend that budget
(Figure 3's FLOP-matched protocol) instead of the preset's common step count (Table 1's). The cpu
preset's raw Shakespeare is tokenized once into token stores in <out>/data (the same token ids, so the
same batches, without tokenizing inside the training loop); <out>/.jax_cache keeps compiled steps.

Writes, in --out (default runs/lrt_comparison_<preset>):
  rows.jsonl    one line per row as it finishes
  results.json  per row: label, arch, params (and over vanilla1x), expected training FLOPs (total, per
                step), steps, decode blocks per token, BPB at its own K and at every evaluated K
  results.md    Table 1 (params, decode blocks, FLOPs, BPB), Table 2 (BPB vs evaluation K), Table 3
                (ablations against tt1); also printed
  results.png   BPB vs training FLOPs per row, and BPB vs evaluation K for the sampled-K rows
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import shutil
import sys
import time
from pathlib import Path

from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
# Run as a file from a checkout, not installed: the repo root holds t2mlr_jax.
sys.path.insert(0, str(ROOT))
from experiments.benchmarks.report import markdown_table  # noqa: E402
from t2mlr_jax.config_utils import config_module  # noqa: E402

SCRIPT = "experiments/lrt_comparison.py"
REFERENCE = "vanilla1x"  # params and decode blocks are relative to it (Table 1's normalisation)
# Table 1's rows in the paper's order, then Table 3's ablations of tt1.
TABLE1 = (
    "vanilla1x",
    "vanilla2x",
    "vanilla3x",
    "loop2",
    "loop3",
    "loop4",
    "ponder1",
    "ponder2",
    "lrt1x",
    "lrt2x",
    "lrt3x",
    "tt1",
    "tt2",
)
ABLATIONS = ("no_cross", "no_kv", "fixed_k1")
TABLE3 = ("tt1", *ABLATIONS, "ponder1")
FIXED_K = {"lrt1x": 0, "fixed_k1": 1}  # Table 2's fixed-K rows: trained at this K only


def load_rows_config():
    """configs/lrt_comparison.py as a module (the configs folder is not a package)."""
    return config_module(ROOT / "configs" / "lrt_comparison.py")


ROWS_CONFIG = load_rows_config()
ROWS = ROWS_CONFIG.ROWS


def paper_order(names) -> list[str]:
    order = [*TABLE1, *ABLATIONS, *(r for r in ROWS if r not in TABLE1 and r not in ABLATIONS)]
    return [r for r in order if r in names]


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers, got {text!r}") from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"thought counts must be >= 0, got {text!r}")
    return values


def resolve_rows(text: str) -> list[str]:
    wanted = [r.strip() for r in text.split(",") if r.strip()]
    unknown = ROWS_CONFIG.unknown_rows(wanted)
    if unknown or not wanted:
        raise SystemExit(f"error: --rows: unknown {unknown or 'empty list'}; choose from {', '.join(ROWS)}")
    return paper_order(set(wanted))


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=SCRIPT, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--preset",
        choices=list(ROWS_CONFIG.SCALES),
        default="cpu",
        help="the scale of every row: cpu (offline Shakespeare, 2 layers x 64 wide, ~30 min for all rows on "
        "2 cores) or paper (nanochat(16), 2048-token rows; give --train_path/--eval_path/--tokenizer)",
    )
    parser.add_argument("--rows", default=",".join(ROWS), help="comma list of " + ",".join(ROWS))
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
    parser.add_argument("--seed", type=int, default=0, help="config.seed of every row")
    parser.add_argument("--steps", type=int, help="train.steps of every row (default: the preset's)")
    parser.add_argument("--batch_size", type=int, help="train.batch_size (default: the preset's)")
    parser.add_argument("--eval_examples", type=int, help="eval.num_examples (default: the preset's)")
    parser.add_argument("--eval_batch_size", type=int, help="eval.batch_size (default: the preset's)")
    parser.add_argument("--train_path", help="data.train_path (the paper preset has none)")
    parser.add_argument("--eval_path", help="data.eval_path (the paper preset has none)")
    parser.add_argument("--tokenizer", help="data.tokenizer (the paper preset has none)")
    return parser.parse_args(argv)


# ---------------------------------------------------------------------------------------------- configs


def row_config(row: str, args: argparse.Namespace):
    config = ROWS_CONFIG.get_config(f"{row},{args.preset}")
    config.seed = args.seed
    config.train.flop_budget = float(args.flop_budget)
    for value, path in (
        (args.steps, "train.steps"),
        (args.batch_size, "train.batch_size"),
        (args.eval_examples, "eval.num_examples"),
        (args.eval_batch_size, "eval.batch_size"),
        (args.train_path, "data.train_path"),
        (args.eval_path, "data.eval_path"),
        (args.tokenizer, "data.tokenizer"),
    ):
        if value is not None:
            section, field = path.split(".")
            config[section][field] = value
    return config


def decode_blocks(row: str, config) -> dict:
    """Backbone blocks run per decoded vocabulary token: L x depth x loops, or L x (K + 1) in thought rows."""
    depth = ROWS[row].depth
    reference = config.model.num_layers // depth
    loops = config.looped.repeats if config.arch == "looped" else 1
    k, blocks = ROWS_CONFIG.decode_thoughts(config), ROWS_CONFIG.decode_blocks(config)
    shown = f"{reference}×({k}+1)" if k else f"{reference}×{depth}×{loops}"
    return {"blocks": blocks, "blocks_ratio": blocks / reference, "blocks_formula": f"{shown} = {blocks}"}


def check_data_paths(config, preset: str) -> None:
    """The paper preset ships no data: say so in one line before anything is built."""
    if preset != "paper":
        return
    for field, flag in (
        ("train_path", "--train_path"),
        ("eval_path", "--eval_path"),
        ("tokenizer", "--tokenizer"),
    ):
        if not config.data[field]:
            raise ValueError(
                f"--preset=paper needs {flag} (data.{field} is empty): token stores or raw text from "
                "tools/prepare_text.py and nanochat's 32,768-token tokenizer (tools/train_tokenizer.py)"
            )


# ---------------------------------------------------------------------------------------------- running


def pretokenize(config, cache: Path) -> None:
    """Point the cpu preset's raw-text data at token stores of the same documents (cached in `cache`).

    The raw-text pipeline tokenizes whole plays in grain's prefetch threads while a step runs; on two
    cores that roughly doubles a row's time. A token store holds the same token ids, documents in the
    same order (t2mlr_jax.data.documents.list_files), so every row sees the same batches either way."""
    from t2mlr_jax.data.documents import DOCUMENT_SUFFIXES, list_files
    from t2mlr_jax.data.token_store import METADATA_FILE, TokenStoreWriter, write_documents
    from t2mlr_jax.data.tokenizer import load_tokenizer

    d = config.data
    tokenizer = None
    for field in ("train_path", "eval_path"):
        paths = [p.strip() for p in d[field].split(",") if p.strip()]
        if any(os.path.isfile(os.path.join(p, METADATA_FILE)) for p in paths):
            continue  # already a token store
        key = hashlib.sha1(json.dumps([paths, d.tokenizer]).encode()).hexdigest()[:12]
        store = cache / f"{field.removesuffix('_path')}-{key}"
        if not (store / METADATA_FILE).exists():
            tokenizer = tokenizer or load_tokenizer(d.tokenizer)
            partial = store.with_name(store.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            writer = TokenStoreWriter(
                str(partial),
                split=field.removesuffix("_path"),
                vocab_size=tokenizer.vocab_size,
                eos_id=tokenizer.eos_id,
                tokenizer=d.tokenizer,
            )
            write_documents(writer, tokenizer, list_files(paths, DOCUMENT_SUFFIXES))
            writer.close()
            partial.rename(store)
        d[field] = str(store)


def _fail(error: Exception) -> None:
    """Bad input: one line on stderr, exit status 2, no traceback (as main.py)."""
    print(f"error: {error}", file=sys.stderr)
    raise SystemExit(2)


def _setup_jax(out: Path) -> None:
    """CPU runs are compile-bound: keep compiled steps across reruns (unless a cache is already set)."""
    from t2mlr_jax.train.compilation_cache import enable_compilation_cache

    enable_compilation_cache(str(out / ".jax_cache"))


def _eval_at(config, workdir: Path, data, k: int) -> dict:
    """The trained weights of `workdir` evaluated at K = k thought slots per token."""
    from t2mlr_jax.train.trainer import Run, restore_state, run_eval

    config = config.copy_and_resolve_references()
    config.eval.thoughts = k
    run = Run(config, workdir, data, config.arch)
    state, _ = restore_state(run)
    return run_eval(run, state.params, state.model_state)


def run_row(row: str, config, out: Path, eval_thoughts: tuple[int, ...], reference_params: int) -> dict:
    """Train (or resume, or skip) one row, evaluate it at its K and, for sampled-K rows, at each of
    eval_thoughts; its result (with `new` = whether anything was computed now)."""
    from t2mlr_jax.storage.workdir import SUMMARY
    from t2mlr_jax.train.build_data import build_data_source
    from t2mlr_jax.train.trainer import Run, train

    workdir = out / row
    started = time.time()
    data = build_data_source(config)
    new = False
    summary_path = workdir / SUMMARY
    if summary_path.exists():
        summary = json.loads(summary_path.read_text())
    else:
        run = Run(config, workdir, data, config.arch)
        tqdm.write(
            f"{row}: training {config.arch} ({run.num_params:,} params, {config.train.steps} steps"
            + (f", {run.flops_per_step:.3g} FLOPs per step" if run.flops_per_step else "")
            + f") in {workdir}"
        )
        summary = train(run)
        if "stopped_by" in summary:
            return {"row": row, "stopped_by": summary["stopped_by"], "step": summary["step"]}
        new = True
    trained_now = new
    trained_at = time.time()
    trained = ROWS_CONFIG.trained_thoughts(config)
    k_own = ROWS_CONFIG.decode_thoughts(config)
    bpb_by_k = {k_own: summary["eval"]["bpb"]}
    if len(trained) > 1:
        for k in tqdm(eval_thoughts, desc=f"{row} eval K", file=sys.stderr, leave=False):
            if k == k_own:
                continue
            path = workdir / f"eval_thoughts{k}.json"
            if path.exists():
                metrics = json.loads(path.read_text())
            else:
                metrics = _eval_at(config, workdir, data, k)
                path.write_text(json.dumps(metrics, indent=2, default=str))
                new = True
            bpb_by_k[k] = metrics["bpb"]
    params = summary["num_params"]
    return {
        "row": row,
        "label": ROWS[row].label,
        "arch": config.arch,
        "params": params,
        "params_ratio": params / reference_params,
        "layers": config.model.num_layers,
        **decode_blocks(row, config),
        "train_flops": summary.get("train_flops"),
        "flops_per_step": summary.get("flops_per_step"),
        "steps": summary["steps"],
        "thoughts_trained": list(trained),
        "thoughts": k_own,
        "bpb": summary["eval"]["bpb"],
        "loss": summary["eval"]["loss"],
        "bpb_by_k": {str(k): bpb_by_k[k] for k in sorted(bpb_by_k)},
        "train_seconds": round(trained_at - started, 1) if trained_now else None,  # training + its eval
        "eval_seconds": round(time.time() - trained_at, 1),
        "new": new,
    }


def reference_params(args: argparse.Namespace) -> int:
    """vanilla1x's parameter count at this scale (built, not trained: Table 1 normalises by it)."""
    from t2mlr_jax.architectures import build_architecture

    return build_architecture(row_config(REFERENCE, args)).num_params()


# ---------------------------------------------------------------------------------------------- report


def _bpb(value) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.4f}"


def _flops(value) -> str:
    return "—" if not value else f"{value:.3g}"


def table1(results: dict) -> str:
    header = [
        "Model",
        "Row",
        "Params",
        "Params ratio",
        "Decode blocks / token",
        "Train FLOPs",
        "FLOPs / step",
        "Steps",
        "BPB ↓",
    ]
    rows = []
    for name in paper_order(results):
        r = results[name]
        k = f" (K={r['thoughts']})" if r["thoughts"] else ""
        rows.append(
            [
                r["label"],
                f"`{name}`",
                f"{r['params']:,}",
                f"{r['params_ratio']:.2f}×",
                f"{r['blocks_formula']} ({r['blocks_ratio']:.0f}×)",
                _flops(r["train_flops"]),
                _flops(r["flops_per_step"]),
                r["steps"],
                _bpb(r["bpb"]) + k,
            ]
        )
    return markdown_table(header, rows)


def table2(results: dict, eval_thoughts: tuple[int, ...]) -> str | None:
    sampled = [n for n in paper_order(results) if len(results[n]["thoughts_trained"]) > 1]
    fixed = [n for n in FIXED_K if n in results]
    if not sampled:
        return None
    ks = sorted({*eval_thoughts, *(int(k) for n in sampled + fixed for k in results[n]["bpb_by_k"])})
    rows = []
    for name in fixed + sampled:
        r = results[name]
        trained = r["thoughts_trained"]
        what = (
            f"Fixed K={trained[0]}"
            if len(trained) == 1
            else "One model, sampled K∈{" + ",".join(map(str, trained)) + "}"
        )
        cells = []
        for k in ks:
            value = r["bpb_by_k"].get(str(k))
            cells.append("–" if value is None else _bpb(value) + ("†" if k > max(trained) else ""))
        rows.append([f"{what} ({r['label']}, `{name}`)", *cells])
    return markdown_table(["Training", *(f"K={k}" for k in ks)], rows)


def table3(results: dict) -> str | None:
    names = [n for n in TABLE3 if n in results]
    if len(names) < 2:
        return None
    full = results["tt1"]["bpb"] if "tt1" in results else None
    rows = []
    for name in names:
        r = results[name]
        delta = "—" if name == "tt1" or full is None else f"{r['bpb'] - full:+.4f}"
        rows.append([f"{r['label']} (`{name}`)", _bpb(r["bpb"]), delta])
    return markdown_table(["Configuration", "BPB ↓", "Increase over full LRT (tt1)"], rows)


def render(meta: dict, results: dict) -> str:
    parts = [
        f"# Depth versus time: the comparison ({meta['preset']})",
        "",
        f"`{meta['command']}` on {meta['device']}, jax {meta['jax']}; wall time {meta['wall_seconds']:.0f} s "
        f"(this invocation). Seed {meta['seed']}; "
        + (
            f"FLOP-matched: {meta['flop_budget']:.3g} training FLOPs per row."
            if meta["flop_budget"]
            else "the same training steps for every row (Table 1's protocol)."
        ),
        "",
        "## Table 1: parameters, decode blocks, training FLOPs and BPB",
        "",
        table1(results),
        "",
        f"- Params ratio: over `{REFERENCE}` ({meta['reference_params']:,} params). Decode blocks per "
        "vocabulary token: L (reference layers) × depth × loops, or L × (K + 1) for thought rows; the ratio "
        "is over the reference L.",
        "- Train FLOPs: the trainer's expected training FLOPs (refinement passes P and thought counts K "
        "averaged over their sampling distributions, the expanded attention length counted).",
        "- BPB: exact sequential recurrence with the KV cache on held-out rows of the reference length; "
        "thought rows at K shown (their largest trained K).",
    ]
    t2 = table2(results, meta["eval_thoughts"])
    if t2:
        parts += [
            "",
            "## Table 2: BPB vs evaluation thought steps K",
            "",
            t2,
            "",
            "- Each row is one trained model; sampled-K rows reuse the same weights in every column. "
            "† beyond the row's trained range, – not evaluated.",
        ]
    t3 = table3(results)
    if t3:
        parts += ["", "## Table 3: ablations of the one-thought-token LRT (at K = 1)", "", t3]
    timed = [f"`{n}` {meta['row_seconds'][n]:.0f}" for n in paper_order(results) if n in meta["fresh"]]
    if timed:
        parts += [
            "",
            "Wall seconds per row trained or evaluated in this invocation: " + ", ".join(timed) + ".",
        ]
    return "\n".join(parts) + "\n"


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    for name in paper_order(results):
        r = results[name]
        if r["train_flops"] and math.isfinite(r["bpb"]):
            left.scatter(r["train_flops"], r["bpb"], s=25)
            left.annotate(
                name, (r["train_flops"], r["bpb"]), fontsize=8, xytext=(3, 3), textcoords="offset points"
            )
    left.set_xscale("log")
    left.set(
        xlabel="training FLOPs (expected)", ylabel="BPB (exact recurrence)", title="BPB vs training FLOPs"
    )
    left.grid(alpha=0.3)
    sampled = [n for n in paper_order(results) if len(results[n]["thoughts_trained"]) > 1]
    for name in sampled:
        r = results[name]
        ks = sorted(int(k) for k in r["bpb_by_k"])
        trained = "{" + ",".join(map(str, r["thoughts_trained"])) + "}"
        (line,) = right.plot(
            ks, [r["bpb_by_k"][str(k)] for k in ks], marker="o", label=f"{name} (K∈{trained})"
        )
        beyond = [k for k in ks if k > max(r["thoughts_trained"])]  # hollow: beyond the trained range
        right.scatter(beyond, [r["bpb_by_k"][str(k)] for k in beyond], s=60, facecolors="white", zorder=3,
                      edgecolors=line.get_color())  # fmt: skip
    right.xaxis.get_major_locator().set_params(integer=True)
    right.set(xlabel="evaluation thought steps K", ylabel="BPB", title="BPB vs evaluation K (sampled-K rows)")
    right.grid(alpha=0.3)
    if sampled:
        right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_results(out: Path, meta: dict, results: dict) -> str:
    payload = {"meta": meta, "rows": {n: results[n] for n in paper_order(results)}}
    (out / "results.json").write_text(json.dumps(payload, indent=1, default=str))
    markdown = render(meta, results)
    (out / "results.md").write_text(markdown)
    plot(results, out / "results.png")
    return markdown


# ---------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    rows = resolve_rows(args.rows)
    out = Path(args.out or f"runs/lrt_comparison_{args.preset}")
    started = time.time()
    try:  # every config built and checked before anything is compiled
        configs = {row: row_config(row, args) for row in rows}
        check_data_paths(configs[rows[0]], args.preset)
        from t2mlr_jax.architectures import build_architecture
        from t2mlr_jax.train.build_data import build_data_source

        for config in configs.values():
            build_architecture(config)
        build_data_source(configs[rows[0]])  # paths and tokenizer
        reference = reference_params(args)
        out.mkdir(parents=True, exist_ok=True)
        if args.preset == "cpu":
            for config in configs.values():
                pretokenize(config, out / "data")
    except (ValueError, KeyError, FileNotFoundError) as e:
        _fail(e)
    _setup_jax(out)
    import warnings

    import jax

    # CPU backends cannot donate; the step donates its state for the accelerators that can.
    warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
    device = jax.devices()[0]
    meta = {
        "preset": args.preset,
        "command": " ".join([f"python {SCRIPT}", *argv]),
        "device": f"{device.platform}: {device.device_kind}",
        "jax": jax.__version__,
        "python": platform.python_version(),
        "rows": rows,
        "seed": args.seed,
        "flop_budget": args.flop_budget,
        "eval_thoughts": list(args.eval_thoughts),
        "reference_params": reference,
        "cpus": os.cpu_count(),
    }
    results, row_seconds, fresh = {}, {}, []
    for row in tqdm(rows, desc="rows", file=sys.stderr):
        row_start = time.time()
        try:
            result = run_row(row, configs[row], out, args.eval_thoughts, reference)
        except (ValueError, KeyError, FileNotFoundError) as e:
            _fail(e)
        if "stopped_by" in result:
            tqdm.write(f"{row}: stopped by {result['stopped_by']} at step {result['step']}; rerun to resume")
            break
        row_seconds[row] = round(time.time() - row_start, 1)
        result["row_seconds"] = row_seconds[row]
        results[row] = result
        if result.pop("new"):
            fresh.append(row)
            with open(out / "rows.jsonl", "a") as f:
                f.write(json.dumps(result, default=str) + "\n")
        tqdm.write(f"{row}: BPB {_bpb(result['bpb'])} at K={result['thoughts']} ({row_seconds[row]:.0f} s)")
    meta["wall_seconds"] = round(time.time() - started, 1)
    meta["row_seconds"], meta["fresh"] = row_seconds, fresh
    if not results:
        return {"meta": meta, "rows": {}}
    markdown = write_results(out, meta, results)
    print(markdown)
    return {"meta": meta, "rows": results}


if __name__ == "__main__":
    main()
