"""Table 13 of the T²MLR paper (../shared/papers/000, appendix D): how well each layer's hidden state
anticipates future tokens, T²MLR against its parameter-matched transformer.

For every model, layer l and k in --ks, a small MLP probe (one ReLU hidden layer, Adam) reads the residual
stream after block l (0-based, before the final norm) at position t and predicts the token k steps ahead:
hidden state at t -> token x_{t+k}, so k = 1 is the ordinary next token, the one the LM head predicts.
(The authors' release probes x_{t+2} for its "k=1"; not here.) T²MLR's states are those of the exact
recurrence. Probes train on the positions of some token rows and are scored by top-1 accuracy on the
positions of held-out rows; every k uses the same positions (t + max k inside the row's document).
The probe's classes are the --classes most frequent targets of its training positions plus one "other"
class that never counts as correct, so accuracy is over the full vocabulary (results.json's `coverage`
is its ceiling); the paper reports the probe's loss instead, on FineWeb-Edu, after 20,000 steps.

  python -m experiments.future_token_probe --preset=cpu  # trains a tiny T²MLR and its baseline (minutes)
  python -m experiments.future_token_probe --checkpoint=runs/t2mlr --checkpoint=runs/baseline \\
      --data=data/heldout.txt --ks=1,2,3,4                   # two trained models, any text
  python -m experiments.future_token_probe --preset=paper --checkpoint=... --checkpoint=... --data=...
      # Table 13's scale: 2048-token rows, the last 5 blocks, 20,000 probe steps (for accelerators)

A --checkpoint is anything main.py's config.init_from reads (t2mlr_jax.interop.pretrained.load_pretrained):
a training workdir (its newest step) or step folder, an exported folder, an HF / T²MLR folder or a .gguf.
--data: text files / folders or token stores (t2mlr_jax.data.pipeline.text_batches), tokenized with
--tokenizer (default: the one recorded with the first checkpoint). The cpu preset trains
configs/smollm135m_t2mlr.py:cpu and :baseline,cpu (4 layers x 64 wide, SmolLM2 vocabulary) on Shakespeare
without the held-out plays into <out>/t2mlr and <out>/transformer (a rerun reuses them), then probes
256 rows of 64 tokens of the held-out plays (The Tempest, The Winter's Tale).

Writes, in --out (default runs/future_token_probe_<preset>):
  results.json  per model: checkpoint, window, and top-1 accuracy and probe loss per k and layer; the
                settings, positions and class coverage
  results.md    accuracy per layer (rows) and k x model (columns); also printed
  results.png   accuracy vs layer, one line per model and k (the T²MLR window shaded)
Bad arguments (a missing checkpoint or data path, k < 1, a layer out of range) are one `error:` line on
stderr and exit status 2, before anything is trained or compiled.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
from jaxtyping import Float
from tqdm import tqdm

from t2mlr_jax.analysis.plots import subplots
from t2mlr_jax.config.cli import OneLineParser, fail
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.token_layout import Layout
from t2mlr_jax.studies.analysis_common import setup_jax, train_run
from t2mlr_jax.studies.benchmarks.report import environment, markdown_table
from t2mlr_jax.studies.future_token_probe_fit import (
    ProbeSettings,
    fit_probes,
    jitted_layer_states,
    probe_data,
)
from t2mlr_jax.studies.gate_trajectories import cpu_config

COMMAND = "python -m experiments.future_token_probe"
# Probe and data sizes per preset; every one is also a flag.
PRESETS = {
    "cpu": dict(
        seq_len=64, rows=256, chunk=64, layers=(), hidden=128, steps=300, batch=256, lr=3e-3, classes=256
    ),
    "paper": dict(
        seq_len=2048,
        rows=128,
        chunk=8,
        layers=(-5, -4, -3, -2, -1),
        hidden=1024,
        steps=20_000,
        batch=1024,
        lr=1e-3,
        classes=8192,
    ),
}
CPU_TRAIN_STEPS = 60


# ---------------------------------------------------------------------------------------------- inputs


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers, got {text!r}") from None


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = OneLineParser(prog=COMMAND, description=__doc__)
    parser.add_argument("--preset", choices=list(PRESETS), default="cpu", help="probe and data sizes")
    parser.add_argument(
        "--checkpoint",
        action="append",
        default=[],
        help="a model to probe (repeat: T²MLR and its baseline); none with --preset=cpu: train two tiny ones",
    )
    parser.add_argument("--labels", help="comma list, one per --checkpoint (default: t2mlr / transformer)")
    parser.add_argument(
        "--data", help="text files / folders or token stores, comma list (cpu: held-out plays)"
    )
    parser.add_argument("--tokenizer", help="default: the tokenizer recorded with the first checkpoint")
    parser.add_argument("--ks", type=_ints, default=(1, 2, 3), help="offsets k: state at t -> token x_{t+k}")
    parser.add_argument("--layers", type=_ints, help="comma list of blocks, negative from the end (cpu: all)")
    parser.add_argument("--seq_len", type=int, help="tokens per row")
    parser.add_argument("--rows", type=int, help="token rows probed (train + held-out)")
    parser.add_argument("--chunk", type=int, help="rows per forward call")
    parser.add_argument("--test_fraction", type=float, default=0.25, help="share of rows held out")
    parser.add_argument("--hidden", type=int, help="probe hidden width")
    parser.add_argument("--steps", type=int, help="probe Adam steps")
    parser.add_argument("--batch", type=int, help="probe positions per step")
    parser.add_argument("--lr", type=float, help="probe learning rate")
    parser.add_argument("--classes", type=int, help="probe classes: the most frequent targets (+ other)")
    parser.add_argument("--train_steps", type=int, default=CPU_TRAIN_STEPS, help="cpu preset: LM steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="output folder (default runs/future_token_probe_<preset>)")
    args = parser.parse_args(argv)
    for field, value in PRESETS[args.preset].items():
        if getattr(args, field) is None:
            setattr(args, field, value)
    return args


def check_args(args: argparse.Namespace) -> None:
    if not args.ks or min(args.ks) < 1:
        raise ValueError(f"--ks: every k must be >= 1 (k = 1 is the next token), got {args.ks}")
    if max(args.ks) >= args.seq_len:
        raise ValueError(f"--ks: k must be below --seq_len ({args.seq_len}), got {max(args.ks)}")
    if args.rows < 2 or args.chunk < 1 or args.rows % args.chunk:
        raise ValueError(f"--rows ({args.rows}) must be >= 2 and a multiple of --chunk ({args.chunk})")
    if not 0 < args.test_fraction < 1:
        raise ValueError(f"--test_fraction must be in (0, 1), got {args.test_fraction}")
    for field in ("hidden", "steps", "batch", "classes"):
        if getattr(args, field) < 1:
            raise ValueError(f"--{field} must be >= 1")
    if args.preset != "cpu" and (not args.checkpoint or not args.data):
        raise ValueError(f"--preset={args.preset} needs --checkpoint (each model) and --data")
    for path in args.checkpoint:
        if not Path(path).exists():
            raise ValueError(f"--checkpoint {path!r} does not exist")


class Sources(NamedTuple):
    paths: list[Path]  # the checkpoints
    cfgs: list[ModelConfig]  # their models, read without the weights
    tokenizer: str
    to_train: list  # the cpu preset's two training configs, one per path (empty with --checkpoint)


def model_sources(args: argparse.Namespace, out: Path) -> Sources:
    """The --checkpoints, or with none the cpu preset's T²MLR and baseline, to be trained into `out`."""
    from configs.recipes import shakespeare_split
    from t2mlr_jax.architectures import build_architecture
    from t2mlr_jax.experiment import resolve
    from t2mlr_jax.interop.pretrained import pretrained_config, recorded_tokenizer

    if args.checkpoint:
        paths = [Path(p) for p in args.checkpoint]
        tokenizer = args.tokenizer or recorded_tokenizer(paths[0])
        if not tokenizer:
            raise ValueError(f"{paths[0]} records no tokenizer: give --tokenizer")
        return Sources(paths, [pretrained_config(p) for p in paths], tokenizer, [])
    train_plays, _ = shakespeare_split()  # the held-out plays stay unseen
    configs = [
        cpu_config(preset, args.train_steps, {"data.train_path": train_plays})
        for preset in ("cpu", "baseline,cpu")
    ]
    return Sources(
        [out / config.arch for config in configs],
        [build_architecture(resolve(config)).backbone for config in configs],
        args.tokenizer or configs[0].data.tokenizer,
        configs,
    )


def read_rows(args: argparse.Namespace, tokenizer_path: str, vocab_size: int) -> dict:
    """args.rows rows of args.seq_len tokens of --data, as text_batches packs them (tokens and layout)."""
    from absl import flags

    from configs.recipes import shakespeare_split
    from t2mlr_jax.data.pipeline import text_batches
    from t2mlr_jax.data.tokenizer import load_tokenizer

    flags.FLAGS.mark_as_parsed()  # grain reads absl flags
    paths = args.data or shakespeare_split()[1]
    batches = text_batches(
        [p.strip() for p in paths.split(",") if p.strip()],
        batch_size=args.chunk,
        seq_len=args.seq_len,
        tokenizer=load_tokenizer(tokenizer_path),
        vocab_size=vocab_size,
        shuffle=False,
        num_epochs=1,
    )
    keys = ("tokens", "positions", "segment_ids", "control_flow")
    chunks = [{k: b[k] for k in keys} for _, b in zip(range(args.rows // args.chunk), batches)]
    if len(chunks) * args.chunk < args.rows:
        raise ValueError(f"--data holds fewer than {args.rows} rows of {args.seq_len} tokens; lower --rows")
    return {k: np.concatenate([c[k] for c in chunks]) for k in keys}


def resolve_layers(wanted: tuple[int, ...], num_layers: int) -> list[int]:
    """0-based blocks from --layers (negative: from the end; none: every block)."""
    wanted = wanted or tuple(range(num_layers))
    bad = [i for i in wanted if not -num_layers <= i < num_layers]
    if bad:
        raise ValueError(f"--layers: blocks {bad} outside the models' {num_layers} layers")
    return sorted({i % num_layers for i in wanted})


def model_labels(args: argparse.Namespace, paths: list[Path], cfgs: list[ModelConfig]) -> list[str]:
    if args.labels:
        labels = [s.strip() for s in args.labels.split(",")]
        if len(labels) != len(paths):
            raise ValueError(f"--labels has {len(labels)} labels for {len(paths)} models")
        return labels
    kinds = ["t2mlr" if c.recurrence is not None else "transformer" for c in cfgs]
    return [k if kinds.count(k) == 1 else f"{k} ({p.name})" for k, p in zip(kinds, paths)]


# ---------------------------------------------------------------------------------------------- running


def model_features(
    path: Path, rows: dict, layers: list[int], chunk: int, desc: str
) -> Float[np.ndarray, "L B T D"]:
    """The states [len(layers), rows, T, D] of the model at `path`, loaded as config.init_from is."""
    from t2mlr_jax.interop.pretrained import load_pretrained

    cfg, params = load_pretrained(path)
    parts = []
    for start in tqdm(range(0, len(rows["tokens"]), chunk), desc=desc, file=sys.stderr, leave=False):
        part = {k: jnp.asarray(v[start : start + chunk]) for k, v in rows.items()}
        layout = Layout(part["positions"], part["segment_ids"], part["control_flow"])
        states = jitted_layer_states(cfg, params, part["tokens"], layout)
        parts.append(np.asarray(states[np.asarray(layers)], np.float32))
    return np.concatenate(parts, axis=1)


def model_entry(path: Path, cfg: ModelConfig, result: dict, ks: tuple[int, ...]) -> dict:
    return {
        "checkpoint": str(path),
        "arch": "t2mlr" if cfg.recurrence is not None else "transformer",
        "num_layers": cfg.num_layers,
        "hidden_size": cfg.hidden_size,
        "window": list(cfg.layer_range) if cfg.recurrence is not None else None,
        "accuracy": {str(k): result["accuracy"][:, i].tolist() for i, k in enumerate(ks)},
        "loss": {str(k): result["loss"][:, i].tolist() for i, k in enumerate(ks)},
    }


def render(meta: dict, models: dict) -> str:
    ks, layers = meta["ks"], meta["layers"]
    header = ["Layer (block)", *(f"k={k} {label}" for k in ks for label in models)]
    rows = [
        [f"{layer} ({layer - meta['num_layers']})"]
        + [f"{models[label]['accuracy'][str(k)][i]:.4f}" for k in ks for label in models]
        for i, layer in enumerate(layers)
    ]
    coverage = ", ".join(f"k={k} {meta['coverage'][str(k)]:.3f}" for k in ks)
    windows = ", ".join(
        f"{label} {m['window'][0]}–{m['window'][1]}" for label, m in models.items() if m["window"]
    )
    positions = meta["positions"]
    return "\n".join(
        [
            f"# Future-token probe (T²MLR Table 13, {meta['preset']})",
            "",
            f"`{meta['command']}` on {meta['device']}, jax {meta['jax']}; "
            f"wall time {meta['wall_seconds']:.0f} s.",
            "",
            "Top-1 accuracy on held-out positions of a probe reading the residual stream after block l at "
            "position t and predicting x_{t+k} (k = 1: the next token):",
            "",
            markdown_table(header, rows),
            "",
            "- Layers: 0-based block (counted from the head in brackets: -1 is the last block, before the "
            f"final norm). {positions['train']:,} training and {positions['test']:,} held-out positions from "
            f"{meta['rows']} rows of {meta['seq_len']} tokens; probe: {meta['settings']}.",
            f"- Classes: the {meta['classes']} most frequent training targets + other (never correct); "
            f"the accuracy ceiling (held-out targets inside the classes): {coverage}.",
            f"- T²MLR windows (code layers): {windows or 'none'}. Probe losses in results.json; accuracy vs "
            "layer in results.png.",
        ]
    )


def plot(meta: dict, models: dict, path: Path) -> None:
    fig, ax = subplots(figsize=(7, 4.5))
    for m, (label, entry) in enumerate(models.items()):
        for i, k in enumerate(meta["ks"]):
            ax.plot(meta["layers"], entry["accuracy"][str(k)], ["-", "--", ":", "-."][m % 4], color=f"C{i}",
                    marker="o", label=f"{label}, k={k}")  # fmt: skip
        if entry["window"]:
            span = (entry["window"][0] - 0.5, entry["window"][1] + 0.5)
            ax.axvspan(*span, color="grey", alpha=0.1, label=f"{label} window")
    ax.set(
        xlabel="layer (0-based block)",
        ylabel="top-1 accuracy (held-out)",
        title="hidden state at t → token x_{t+k}",
    )
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def write_results(out: Path, meta: dict, models: dict) -> str:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"meta": meta, "models": models}, indent=1))
    markdown = render(meta, models)
    (out / "results.md").write_text(markdown + "\n")
    plot(meta, models, out / "results.png")
    return markdown


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    started = time.time()
    out = args.out or Path(f"runs/future_token_probe_{args.preset}")
    try:  # every input read and checked before anything is trained or compiled
        check_args(args)
        sources = model_sources(args, out)
        paths, cfgs = sources.paths, sources.cfgs
        if len({c.num_layers for c in cfgs}) > 1 or len({c.vocab_size for c in cfgs}) > 1:
            raise ValueError("the models differ in depth or vocabulary; probe a model with its own baseline")
        labels = model_labels(args, paths, cfgs)
        layers = resolve_layers(args.layers, cfgs[0].num_layers)
        rows = read_rows(args, sources.tokenizer, cfgs[0].vocab_size)
    except (ValueError, KeyError, FileNotFoundError) as e:
        fail(e)
    setup_jax(out)
    for config, path in zip(sources.to_train, paths):
        summary = train_run(config, path)
        if "stopped_by" in summary:
            fail(f"{path}: stopped by {summary['stopped_by']} at step {summary['step']}; rerun to resume")
    data = probe_data(
        rows["tokens"], rows["segment_ids"], args.ks, args.classes, args.test_fraction, args.seed
    )
    settings = ProbeSettings(args.hidden, args.steps, args.batch, args.lr)
    models = {}
    for label, path, cfg in tqdm(list(zip(labels, paths, cfgs)), desc="models", file=sys.stderr):
        features = model_features(path, rows, layers, args.chunk, f"{label} states")
        result = fit_probes(features[:, data.rows, data.times], data, settings, args.seed, f"{label} probes")
        models[label] = model_entry(path, cfg, result, args.ks)
        tqdm.write(
            f"{label}: next-token (k={args.ks[0]}) accuracy by layer {np.round(result['accuracy'][:, 0], 4)}"
        )
    in_classes = data.labels[:, data.test] < len(data.classes)
    meta = {
        **environment(args.preset, COMMAND, argv),
        "wall_seconds": round(time.time() - started, 1),
        "ks": list(args.ks),
        "layers": layers,
        "num_layers": cfgs[0].num_layers,
        "rows": args.rows,
        "seq_len": args.seq_len,
        "data": args.data or "held-out Shakespeare plays (configs.recipes.shakespeare_split)",
        "tokenizer": sources.tokenizer,
        "settings": settings._asdict(),
        "test_fraction": args.test_fraction,
        "seed": args.seed,
        "classes": len(data.classes),
        "positions": {"train": int((~data.test).sum()), "test": int(data.test.sum())},
        "coverage": {str(k): float(in_classes[i].mean()) for i, k in enumerate(args.ks)},
    }
    markdown = write_results(out, meta, models)
    print(markdown)
    print(f"\nwrote {out / 'results.json'}, {out / 'results.md'}, {out / 'results.png'}")
    return {"meta": meta, "models": models}
