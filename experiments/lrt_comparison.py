#!/usr/bin/env python
"""Depth versus time (../shared/papers/002): train every row of the comparison and tabulate it like the
paper's Tables 1-3 and Figure 3.

Each row is a preset of configs/lrt_comparison.py (`<row>,<scale>`), trained by the framework's own
trainer (t2mlr_jax.train.trainer) into <out>/<row>/ and scored in bits per byte with the exact sequential
recurrence: thought rows at their largest trained K, and every row trained with sampled K (lrt.thoughts
with more than one K: tt1, tt2, no_cross, no_kv) also at each K of --eval_thoughts (Table 2), the same
weights evaluated again with config.eval.thoughts = K.

  python -m experiments.lrt_comparison --preset=cpu                       # every row, CPU-sized
  python -m experiments.lrt_comparison --preset=cpu --rows=vanilla1x,tt2  # two rows
  python -m experiments.lrt_comparison --preset=paper --rows=tt1 --train_path=... --eval_path=... \\
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
import os
import platform
import shutil
import sys
import time
from pathlib import Path

from tqdm import tqdm

from experiments.lrt_comparison_report import bpb_text, write_results
from experiments.lrt_comparison_rows import (
    REFERENCE,
    ROWS,
    ROWS_CONFIG,
    check_data_paths,
    decode_blocks,
    paper_order,
    row_config,
)
from t2mlr_jax import cpu_runtime

COMMAND = "python -m experiments.lrt_comparison"


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
        prog=COMMAND, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
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
    from t2mlr_jax.experiment import resolve
    from t2mlr_jax.train.trainer import Run, restore_state, run_eval

    config = config.copy_and_resolve_references()
    config.eval.thoughts = k
    run = Run(resolve(config), workdir, data, config.arch)
    state, _ = restore_state(run)
    return run_eval(run, state.params, state.model_state)


def run_row(row: str, config, out: Path, eval_thoughts: tuple[int, ...], reference_params: int) -> dict:
    """Train (or resume, or skip) one row, evaluate it at its K and, for sampled-K rows, at each of
    eval_thoughts; its result (with `new` = whether anything was computed now)."""
    from t2mlr_jax.experiment import resolve
    from t2mlr_jax.storage.workdir import SUMMARY
    from t2mlr_jax.train.build_data import build_data_source
    from t2mlr_jax.train.trainer import Run, train

    workdir = out / row
    started = time.time()
    data = build_data_source(resolve(config))
    new = False
    summary_path = workdir / SUMMARY
    if summary_path.exists():
        summary = json.loads(summary_path.read_text())
    else:
        run = Run(resolve(config), workdir, data, config.arch)
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
        from t2mlr_jax.experiment import resolve
        from t2mlr_jax.train.build_data import build_data_source

        for config in configs.values():
            build_architecture(resolve(config))
        build_data_source(resolve(configs[rows[0]]))  # paths and tokenizer
        reference = build_architecture(
            resolve(row_config(REFERENCE, args))
        ).num_params()  # Table 1's normaliser
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
        "command": " ".join([COMMAND, *argv]),
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
        tqdm.write(
            f"{row}: BPB {bpb_text(result['bpb'])} at K={result['thoughts']} ({row_seconds[row]:.0f} s)"
        )
    meta["wall_seconds"] = round(time.time() - started, 1)
    meta["row_seconds"], meta["fresh"] = row_seconds, fresh
    if not results:
        return {"meta": meta, "rows": {}}
    markdown = write_results(out, meta, results)
    print(markdown)
    return {"meta": meta, "rows": results}


if __name__ == "__main__":
    cpu_runtime.tune()
    main()
