"""Cost of T²MLR against its parameter-matched transformer (the paper's Tables 7, 8 and 12).

Sections (--sections, comma separated; default all):
  decode      generation time relative to the baseline (Table 7)
  train       Jacobi train-step time relative to the baseline step, next to counted FLOP ratios (Table 12)
  prefill     Jacobi prefill (D = 4..32) against exact prefill: speed-up and deviation (Table 8)
  memory      decode state and compiled train-step memory; the stop-gradient Jacobi passes keep nothing
  throughput  tokens/s and MFU of the train and decode measurements (runs those two sections too)

Every ratio is measured side by side: the variants are interleaved in each repetition (order rotated
per repetition), a warm-up call excludes compilation, each timed call is wrapped in block_until_ready,
and the median over repetitions of the per-repetition ratio is reported.

  python -m experiments.bench --preset=quick --out_dir=runs/bench      # CPU, a few minutes
  python -m experiments.bench --preset=full --out_dir=runs/bench_full  # SmolLM2-135M shapes, bf16, GPU/TPU

Writes <out_dir>/bench_<preset>.json and <out_dir>/bench_<preset>.md and prints the markdown.
The sections live in t2mlr_jax/studies/benchmarks/, one module each.
"""

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import jax
from tqdm import tqdm

from t2mlr_jax.config.cli import OneLineParser
from t2mlr_jax.studies.benchmarks import (
    decode,
    harness,
    memory,
    prefill,
    presets,
    report,
    throughput,
    train,
)

SECTIONS = {"decode": decode, "train": train, "prefill": prefill, "memory": memory, "throughput": throughput}
NEEDS = {"throughput": throughput.NEEDS}


def resolve_sections(text: str) -> list[str]:
    wanted = {s.strip() for s in text.split(",") if s.strip()}
    unknown = wanted - set(SECTIONS)
    if unknown:
        raise SystemExit(f"--sections: unknown {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    for section in list(wanted):
        wanted.update(NEEDS.get(section, ()))
    return [s for s in SECTIONS if s in wanted]


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = OneLineParser(
        prog="python -m experiments.bench",
        description=__doc__,
    )
    parser.add_argument(
        "--preset",
        choices=list(presets.PRESETS),
        default="quick",
        help="smoke: test-sized; quick: CPU-sized SmolLM2; full: SmolLM2-135M shapes, bf16",
    )
    parser.add_argument(
        "--sections", default=",".join(SECTIONS), help="comma-separated subset of " + ",".join(SECTIONS)
    )
    parser.add_argument(
        "--out_dir", default="runs/bench", help="where bench_<preset>.json and .md are written"
    )
    parser.add_argument("--repeats", type=int, help="timed repetitions per variant (default: the preset's)")
    parser.add_argument("--decode_lengths", type=_ints, help="generated tokens, e.g. 512,1024,2048")
    parser.add_argument("--decode_batches", type=_ints, help="decode batch sizes, e.g. 1,8")
    parser.add_argument(
        "--peak_tflops",
        type=float,
        help="peak TFLOP/s per chip for MFU (default by device kind: H100/H200 989, v5e 197, "
        "v5p 459; CPU: none)",
    )
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    sections = resolve_sections(args.sections)
    overrides = {
        k: getattr(args, k)
        for k in ("repeats", "decode_lengths", "decode_batches")
        if getattr(args, k) is not None
    }
    preset = dataclasses.replace(presets.PRESETS[args.preset], **overrides)
    device = jax.devices()[0]
    peak = throughput.default_peak_flops(device) if args.peak_tflops is None else args.peak_tflops * 1e12
    bench = harness.Bench(preset, presets.matched_baseline(preset.model), peak, args.seed)
    started = time.perf_counter()
    for name in tqdm(sections, desc="sections", file=sys.stderr):
        section_start = time.perf_counter()
        bench.results[name] = SECTIONS[name].run(bench)
        bench.results[name]["wall_seconds"] = time.perf_counter() - section_start
    meta = {**report.metadata(args.preset, bench, argv), "wall_seconds": time.perf_counter() - started}
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    markdown = report.render(meta, {SECTIONS[k].TITLE: s for k, s in bench.results.items()})
    (out_dir / f"bench_{args.preset}.md").write_text(markdown)
    payload = {
        "meta": meta,
        "sections": {k: {f: v for f, v in s.items() if f != "markdown"} for k, s in bench.results.items()},
    }
    (out_dir / f"bench_{args.preset}.json").write_text(json.dumps(payload, indent=1))
    print(markdown)
    return payload
