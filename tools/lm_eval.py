#!/usr/bin/env python
"""Score a checkpoint on lm-evaluation-harness tasks (ARC, HellaSwag, OBQA, PIQA, SciQ, WinoGrande, ...).

Examples:
  python tools/lm_eval.py --checkpoint=SmolLM2-135M-Instruct.Q4_1.gguf --tasks=arc_easy,hellaswag --limit 100
  python tools/lm_eval.py --checkpoint=runs/s5 --tasks=my_task --include_path my_tasks/ --out s5.json

The checkpoint is anything config.init_from reads: a .gguf, an HF or T²MLR folder, an export, or a t2mlr /
transformer training workdir (its newest step) or step folder. T²MLR is scored with the exact recurrence;
generation is greedy. The tokenizer is --tokenizer, else the one the checkpoint records; an empty context
(and a rolling log-likelihood's first window) is conditioned on --prefix_token_id, by default the
tokenizer's BOS, else its EOS (lm-eval's `hf` model's default). lm-eval's own
tasks read their data from the Hugging Face hub; --include_path adds the YAML tasks of a folder (local
data files work offline). Results are printed as lm-eval's table and written to --out as JSON.
Bad input (a missing or unreadable checkpoint, no tokenizer, an unknown task, a bad number) is one
`error:` line on stderr and exit status 2, before anything is compiled.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from t2mlr_jax import cpu_runtime
from t2mlr_jax.config.cli import OneLineParser

# This file shares its name with the lm_eval package: without its folder on the import path,
# `import lm_eval` finds the package rather than this script.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = OneLineParser(description=__doc__)
    parser.add_argument("--checkpoint", type=Path, required=True, help="the model to score (see above)")
    parser.add_argument("--tasks", required=True, help="comma list of lm-eval task or group names")
    parser.add_argument("--limit", type=int, help="at most this many documents per task (default: all)")
    parser.add_argument("--num_fewshot", type=int, help="few-shot examples per prompt (default: the task's)")
    parser.add_argument("--include_path", type=Path, help="a folder of extra task YAML files")
    parser.add_argument("--batch_size", type=int, default=8, help="rows per compiled call")
    parser.add_argument(
        "--tokenizer", help="a .gguf, tokenizer.json or its folder (default: the recorded one)"
    )
    parser.add_argument(
        "--prefix_token_id",
        type=int,
        help="the token an empty context is conditioned on (default: the tokenizer's BOS, else its EOS)",
    )
    parser.add_argument("--out", type=Path, default=Path("lm_eval_results.json"), help="the JSON to write")
    return parser.parse_args(argv)


def check_args(args: argparse.Namespace) -> list[str]:
    """The task names; a ValueError or FileNotFoundError for what is wrong before anything is loaded."""
    if not args.checkpoint.exists():  # here, not only in the bridge: before seconds of imports
        raise FileNotFoundError(f"checkpoint {args.checkpoint} does not exist")
    for flag, value, least in (("limit", args.limit, 1), ("num_fewshot", args.num_fewshot, 0)):
        if value is not None and value < least:
            raise ValueError(f"--{flag} must be >= {least}, got {value}")
    if args.batch_size < 1:
        raise ValueError(f"--batch_size must be >= 1, got {args.batch_size}")
    if args.include_path is not None and not args.include_path.is_dir():
        raise FileNotFoundError(f"--include_path {args.include_path} is not a folder")
    if not args.out.parent.is_dir():
        raise FileNotFoundError(f"--out {args.out}: the folder {args.out.parent} does not exist")
    tasks = [name.strip() for name in args.tasks.split(",") if name.strip()]
    if not tasks:
        raise ValueError("--tasks names no task")
    return tasks


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        tasks = check_args(args)
        from t2mlr_jax.train.lm_eval_bridge import (
            checkpoint_tokenizer,
            empty_context_token,
            load_bundle,
            tasks_manager,
        )

        tokenizer = checkpoint_tokenizer(args.checkpoint, args.tokenizer)
        prefix_token_id = empty_context_token(tokenizer, args.prefix_token_id)
        manager = tasks_manager(tasks, args.include_path)
        bundle = load_bundle(args.checkpoint, tokenizer)
    except (ValueError, OSError) as e:  # bad input: the message says what and why
        from t2mlr_jax.formats.files import one_line

        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    from lm_eval.utils import handle_non_serializable, make_table

    from t2mlr_jax.train.lm_eval_bridge import run_tasks

    results = run_tasks(
        bundle,
        tasks,
        limit=args.limit,
        num_fewshot=args.num_fewshot,
        batch_size=args.batch_size,
        manager=manager,
        prefix_token_id=prefix_token_id,
    )
    results["config"]["model_args"] = {
        "checkpoint": str(args.checkpoint),
        "tokenizer": args.tokenizer,
        "prefix_token_id": prefix_token_id,
    }
    print(make_table(results))
    if results.get("groups"):
        print(make_table(results, "groups"))
    args.out.write_text(json.dumps(results, indent=2, default=handle_non_serializable) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    cpu_runtime.tune()
    sys.exit(main())
