"""The rows of the depth-versus-time comparison (experiments/lrt_comparison.py): the presets of
configs/lrt_comparison.py in the paper's order, each row's config with the command line's overrides and the
blocks it decodes per token."""

from __future__ import annotations

import argparse
from pathlib import Path

from t2mlr_jax.config.edit import config_module

ROOT = Path(__file__).resolve().parents[1]
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
    """configs/lrt_comparison.py as a module, loaded by path as --config= loads it."""
    return config_module(ROOT / "configs" / "lrt_comparison.py")


ROWS_CONFIG = load_rows_config()
ROWS = ROWS_CONFIG.ROWS


def paper_order(names) -> list[str]:
    order = [*TABLE1, *ABLATIONS, *(r for r in ROWS if r not in TABLE1 and r not in ABLATIONS)]
    return [r for r in order if r in names]


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
