#!/usr/bin/env python
"""Write a generated task (S5-retrieval, variable assignment, ProsQA-Hard, pathfinding) to JSONL and/or
array_record (one JSON record per entry), deterministically from --seed.

Example:
  python tools/make_dataset.py --task s5_retrieval --split test --num_examples 4800 --seed 0 --out data/s5
  python tools/make_dataset.py --task s5_retrieval --split train --num_examples 100000 \
      --set value_key=action --out data/s5
"""

from __future__ import annotations

import json
import os
import sys

from tqdm import tqdm

from t2mlr_jax import cpu_runtime
from t2mlr_jax.config.cli import OneLineParser
from t2mlr_jax.data.tasks import SPLITS, TASKS, GeneratedTaskSource


def parse_overrides(pairs: list[str]) -> dict:
    """["max_actions=48", "value_key=action"] -> {"max_actions": 48, "value_key": "action"}."""
    overrides = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--set expects key=value, got {pair!r}")
        try:
            overrides[key] = json.loads(raw)
        except json.JSONDecodeError:
            overrides[key] = raw
    return overrides


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(description=__doc__)
    parser.add_argument("--task", required=True, choices=sorted(TASKS))
    parser.add_argument(
        "--split",
        default="train",
        choices=SPLITS,
        help="split name; S5-retrieval test uses N in 1..48, train/validation 1..32",
    )
    parser.add_argument("--num_examples", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out", required=True, help="output folder; files are <split>.jsonl / <split>.array_record"
    )
    parser.add_argument("--format", choices=("jsonl", "array_record", "both"), default="both")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a field of the task's config dataclass (repeatable)",
    )
    args = parser.parse_args(argv)
    try:
        source = GeneratedTaskSource(
            args.task, args.split, seed=args.seed, num_examples=args.num_examples, **parse_overrides(args.set)
        )
    except ValueError as e:
        parser.error(str(e))

    os.makedirs(args.out, exist_ok=True)
    jsonl = (
        open(os.path.join(args.out, f"{args.split}.jsonl"), "w", encoding="utf-8")
        if args.format in ("jsonl", "both")
        else None
    )
    records = None
    if args.format in ("array_record", "both"):
        from array_record.python.array_record_module import ArrayRecordWriter

        records = ArrayRecordWriter(os.path.join(args.out, f"{args.split}.array_record"), "group_size:1")
    for index in tqdm(range(len(source)), desc=f"{args.task}/{args.split}", unit="ex"):
        line = json.dumps(source[index], ensure_ascii=False)
        if jsonl:
            jsonl.write(line + "\n")
        if records:
            records.write(line.encode("utf-8"))
    for handle in (jsonl, records):
        if handle:
            handle.close()
    print(f"wrote {len(source)} {args.task} records to {args.out}")
    return 0


if __name__ == "__main__":
    cpu_runtime.tune()
    sys.exit(main())
