"""The rows of the depth-versus-time comparison (experiments/lrt_comparison.py): the presets of
configs/lrt_comparison.py in the paper's order, each row's config with the command line's overrides and the
blocks it decodes per token."""

from __future__ import annotations

import argparse

from t2mlr_jax.config.edit import config_module
from t2mlr_jax.studies import ROOT
from t2mlr_jax.studies.protocol import Claim

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
FIXED_K = {"lrt1x": 0, **{f"fixed_k{k}": k for k in (1, 2, 3, 4)}}  # Table 2's rows trained at this K only
# Figure 3's rows: each executes 2L blocks per vocabulary token; the study also trains them FLOP-matched
FIGURE3 = ("vanilla2x", "loop2", "ponder1", "lrt2x", "tt1")
# A claim of parity ("recovers", "matches", "no difference") holds when the paired difference's whole
# interval lies within this many BPB: the paper's own gain from doubling depth (Table 1, 0.818 -> 0.798),
# so that "matches" means closer than what a second stack of layers buys.
PARITY_MARGIN = 0.020


def at_k(row: str, k: int) -> str:
    """The name of a sampled-K row's weights evaluated at K = k (Table 2's columns)."""
    return f"{row}@K={k}"


def flop_matched(row: str) -> str:
    """The name of a row trained FLOP-matched (Figure 3's protocol) rather than at the study's steps."""
    return f"{row}@flops"


def base_row(name: str) -> str:
    """The row a run name trains (a FLOP-matched run's row)."""
    return name.removesuffix(flop_matched(""))


def trained_name(name: str) -> str:
    """The trained run a claim's value comes from: a row at another K is the row's own weights."""
    return name.split("@K=")[0]


# The papers' claims each table makes, as paired comparisons (row against baseline, lower BPB = -1), with
# the paper's own figures (16-layer reference; Tables 1-3 at data ratio 10, equal steps; Figure 3 at equal
# training FLOPs). Parity claims (sign 0) are judged as equivalence within PARITY_MARGIN.
CLAIMS = {
    "Table 1": (
        Claim("lrt1x", "vanilla1x", "0.798 vs 0.818 (−0.020)", -1),
        Claim("vanilla2x", "vanilla1x", "0.798 vs 0.818 (−0.020)", -1),
        Claim("tt1", "lrt1x", "0.783 vs 0.798 (−0.015)", -1),
        Claim("tt1", "loop2", "0.783 vs 0.804 (−0.021)", -1),
        Claim("tt1", "ponder1", "0.783 vs 0.797 (−0.014)", -1),
        Claim("tt1", "lrt2x", "0.783 vs 0.780 (+0.003): recovers 83-95% of doubling depth", 0, PARITY_MARGIN),
        Claim("tt2", "tt1", "0.776 vs 0.783 (−0.007)", -1),
        Claim("tt2", "lrt3x", "0.776 vs 0.771 (+0.005): near 3x depth", 0, PARITY_MARGIN),
    ),
    "Table 2": (
        Claim("tt1", "fixed_k1", "0.783 vs 0.786 (−0.003)", -1),
        Claim("tt2", "fixed_k2", "0.776 vs 0.779 (−0.003)", -1),
        Claim("fixed_k2", "fixed_k1", "0.779 vs 0.786 (−0.007)", -1),
        Claim("tt2", at_k("tt2", 0), "K=2 0.776 vs K=0 0.789 (−0.013)", -1),
        Claim(at_k("tt2", 3), "tt2", "K=3 0.782 vs K=2 0.776 (+0.006)", 1),
        Claim("fixed_k3", "fixed_k2", "0.779 vs 0.779 (0.000)", 0, PARITY_MARGIN),
        Claim("fixed_k4", "fixed_k2", "0.779 vs 0.779 (0.000)", 0, PARITY_MARGIN),
    ),
    "Table 3": (
        Claim("no_cross", "tt1", "0.792 vs 0.783 (+0.009)", 1),
        Claim("no_kv", "tt1", "0.787 vs 0.783 (+0.004)", 1),
        Claim("fixed_k1", "tt1", "0.786 vs 0.783 (+0.003)", 1),
        Claim("ponder1", "tt1", "0.797 vs 0.783 (+0.014)", 1),
    ),
    "Figure 3": (
        Claim(flop_matched("tt1"), flop_matched("ponder1"), "below PonderLM-2 at every budget", -1),
        Claim(flop_matched("tt1"), flop_matched("loop2"), "overtakes Loop2 as compute grows", -1),
        Claim(
            flop_matched("tt1"),
            flop_matched("vanilla2x"),
            "gap to double depth narrows to 0.001",
            0,
            PARITY_MARGIN,
        ),
    ),
}


def load_rows_config():
    """configs/lrt_comparison.py as a module, loaded by path as --config= loads it."""
    return config_module(ROOT / "configs" / "lrt_comparison.py")


ROWS_CONFIG = load_rows_config()
ROWS = ROWS_CONFIG.ROWS


def paper_order(names) -> list[str]:
    order = [*TABLE1, *ABLATIONS, *FIXED_K, *ROWS]
    order = list(dict.fromkeys(order))
    return [r for r in order if r in names]


def row_config(row: str, args: argparse.Namespace):
    config = ROWS_CONFIG.get_config(f"{row},{args.preset}")
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
