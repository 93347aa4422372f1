"""Cost of the Latent Recurrent Transformer (LRT) against its vanilla backbone, measured side by side.

Sections (--sections, comma separated; default all):
  decode  generation time per token, LRT (feedback=both) over vanilla (feedback=none: the plain backbone
          through the same code path); the paper's Table 1 "decode latency" for LRT 1x depth is 1.1x
  train   the real jitted train step (Muon) for P = 1, 2, 3, 4 refinement passes over vanilla, next to the
          FLOP ratio counted from the traced step, and the step expected under P ~ (0.4, 0.3, 0.2, 0.1)
  rows    decode time per vocabulary token of each row of the paper's Table 1 (configs/lrt_comparison.py:
          vanilla / looped / LRT at 1-3x, thought tokens, PonderLM-2), each its architecture's own
          generate, over the 1x transformer, next to the paper's decode-latency column

Every ratio is measured side by side: the variants are interleaved in each repetition (order rotated
per repetition), a warm-up call excludes compilation, each timed call is wrapped in block_until_ready,
and the median over repetitions of the per-repetition ratio is reported.

  python -m experiments.bench_lrt --preset=quick --out_dir=runs/bench_lrt      # CPU, a few minutes
  python -m experiments.bench_lrt --preset=full --out_dir=runs/bench_lrt_full  # nanochat(16), bf16, GPU

Writes <out_dir>/bench_lrt_<preset>.json and <out_dir>/bench_lrt_<preset>.md and prints the markdown.
The sections live in t2mlr_jax/studies/benchmarks/lrt_decode.py, lrt_train.py and lrt_rows.py (presets:
lrt.py).
"""

import argparse
import dataclasses
import json
import sys
import time
import warnings
from pathlib import Path

from tqdm import tqdm

from t2mlr_jax.config.cli import OneLineParser
from t2mlr_jax.studies.benchmarks import lrt, lrt_decode, lrt_rows, lrt_train, report

COMMAND = "python -m experiments.bench_lrt"
# name -> (title on the page, run(preset, seed) -> {"rows", "markdown", "notes", ...})
SECTIONS = {
    "decode": ("Decode: LRT vs vanilla (Table 1 decode latency)", lrt_decode.decode),
    "train": ("Train step: P refinement passes vs vanilla, time and counted FLOPs", lrt_train.train),
    "rows": ("Table 1 rows: decode time per vocabulary token over the 1x transformer", lrt_rows.rows),
}


def resolve_sections(text: str) -> list[str]:
    wanted = {s.strip() for s in text.split(",") if s.strip()}
    unknown = wanted - set(SECTIONS)
    if unknown:
        raise SystemExit(f"--sections: unknown {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    return [s for s in SECTIONS if s in wanted]


def resolve_rows(text: str) -> tuple[str, ...]:
    rows = tuple(dict.fromkeys(r.strip() for r in text.split(",") if r.strip()))
    unknown = lrt_rows.comparison().unknown_rows(rows)
    if unknown:
        raise SystemExit(f"--rows: unknown {unknown}; choose from {', '.join(lrt_rows.comparison().ROWS)}")
    return rows


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = OneLineParser(prog=COMMAND, description=__doc__)
    parser.add_argument(
        "--preset",
        choices=list(lrt.PRESETS),
        default="quick",
        help="test: seconds; quick: CPU-sized nanochat, fp32; full: nanochat(16), bf16, batch 128, "
        "1024 + 1024 tokens",
    )
    parser.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help="comma-separated subset of " + ",".join(SECTIONS),
    )
    parser.add_argument("--out_dir", default="runs/bench_lrt", help="where bench_lrt_<preset>.json/.md go")
    parser.add_argument("--repeats", type=int, help="timed repetitions per variant (default: the preset's)")
    parser.add_argument("--decode_batch", type=int, help="decode batch size (default: the preset's)")
    parser.add_argument("--prompt_len", type=int, help="prompt tokens (default: the preset's)")
    parser.add_argument("--new_tokens", type=int, help="generated tokens (default: the preset's)")
    parser.add_argument("--train_batch", type=int, help="train rows per step (default: the preset's)")
    parser.add_argument("--grad_accum", type=int, help="train micro-batches per step (default: the preset's)")
    parser.add_argument(
        "--rows", help="rows section: comma-separated configs/lrt_comparison.py rows (default: the preset's)"
    )
    parser.add_argument(
        "--rows_new_tokens", type=int, help="rows section: tokens generated per row (default: the preset's)"
    )
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    sections = resolve_sections(args.sections)
    fields = ("repeats", "decode_batch", "prompt_len", "new_tokens", "train_batch", "grad_accum")
    fields += ("rows_new_tokens",)
    overrides = {k: getattr(args, k) for k in fields if getattr(args, k) is not None}
    if args.rows is not None:
        overrides["rows"] = resolve_rows(args.rows)
    preset = dataclasses.replace(lrt.PRESETS[args.preset], **overrides)
    # CPU backends cannot donate; the step donates its state for the accelerators that can.
    warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
    started = time.perf_counter()
    results = {}
    for name in tqdm(sections, desc="sections", file=sys.stderr):
        section_start = time.perf_counter()
        results[name] = SECTIONS[name][1](preset, args.seed)
        results[name]["wall_seconds"] = time.perf_counter() - section_start
    models = lrt.describe_models(preset)
    meta = {
        **report.environment(args.preset, COMMAND, argv),
        "repeats": preset.repeats,
        "seed": args.seed,
        **models,
        "preset_settings": {k: v for k, v in dataclasses.asdict(preset).items() if k != "model"},
        "wall_seconds": time.perf_counter() - started,
    }
    header = [
        report.run_line(meta) + f" Wall time {meta['wall_seconds']:.0f} s.",
        "",
        f"- backbone: {models['backbone']}",
        f"- LRT (feedback=both, per-layer W^fb): {models['lrt_params']:,} params; vanilla (feedback=none): "
        f"{models['vanilla_params']:,}",
    ]
    markdown = report.page(
        f"LRT cost benchmark ({args.preset})",
        header,
        {SECTIONS[k][0]: s for k, s in results.items()},
    )
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"bench_lrt_{args.preset}.md").write_text(markdown)
    payload = {
        "meta": meta,
        "sections": {k: {f: v for f, v in s.items() if f != "markdown"} for k, s in results.items()},
    }
    (out_dir / f"bench_lrt_{args.preset}.json").write_text(json.dumps(payload, indent=1))
    print(markdown)
    return payload
