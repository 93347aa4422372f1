#!/usr/bin/env python
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

  python experiments/future_token_probe.py --preset=cpu  # trains a tiny T²MLR and its baseline (minutes)
  python experiments/future_token_probe.py --checkpoint=runs/t2mlr --checkpoint=runs/baseline \\
      --data=data/heldout.txt --ks=1,2,3,4                   # two trained models, any text
  python experiments/future_token_probe.py --preset=paper --checkpoint=... --checkpoint=... --data=...
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
import functools
import json
import math
import sys
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
from jaxtyping import Array, Bool, Float, Int
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
# Run as a file from a checkout, not installed: the repo root holds t2mlr_jax.
sys.path.insert(0, str(ROOT))
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

from experiments.analysis_common import OneLineParser, fail, setup_jax, train_run  # noqa: E402
from experiments.benchmarks.report import environment, markdown_table  # noqa: E402
from experiments.gate_trajectories import cpu_config  # noqa: E402
from t2mlr_jax.model.backbone import embed, init_cache  # noqa: E402
from t2mlr_jax.model.config import ModelConfig  # noqa: E402
from t2mlr_jax.model.fusion import fuse  # noqa: E402
from t2mlr_jax.model.recurrence import Layout, decode_step, layout_blocks, scan_over_tokens, shift_right  # noqa: E402

SCRIPT = "experiments/future_token_probe.py"
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


class ProbeSettings(NamedTuple):
    hidden: int  # the probe's hidden width
    steps: int  # Adam steps
    batch: int  # positions per step
    lr: float


class ProbeData(NamedTuple):
    """The probed positions, shared by every model: position `times[n]` of token row `rows[n]`."""

    rows: Int[np.ndarray, " N"]
    times: Int[np.ndarray, " N"]
    labels: Int[np.ndarray, "K N"]  # class of x_{t+k}; len(classes) ("other") outside the probe's classes
    test: Bool[np.ndarray, " N"]  # held-out rows
    classes: Int[np.ndarray, " C"]  # the token id of each class


# ---------------------------------------------------------------------------------------------- states


def exact_caches(
    cfg: ModelConfig, params: dict, tokens: Int[Array, "B T"], layout: Layout
) -> Float[Array, "B T D"]:
    """The cache each token is fused with under the exact recurrence, R_{t-1} (zeros at a document start):
    exact_forward's scan of decode_step, keeping every token's R_t."""
    b, t = tokens.shape

    def step(carry, token, token_layout):
        out = decode_step(cfg, params, token, *carry, token_layout)
        return (out.recurrent_state, out.cache), out.recurrent_state

    start = (jnp.zeros((b, cfg.hidden_size), cfg.dtype), init_cache(cfg, b, t))
    _, caches = scan_over_tokens(step, start, tokens, layout)
    return shift_right(caches, layout.positions)


def layer_states(
    cfg: ModelConfig, params: dict, tokens: Int[Array, "B T"], layout: Layout
) -> Float[Array, "L B T D"]:
    """The residual stream after every block (before the final norm) at every position. For T²MLR, the
    states of the exact recurrence: token t's states depend on earlier tokens' states and on R_{t-1} only,
    so one parallel pass with the exact caches fused at l_start computes them all."""
    l_start = cfg.layer_range[0] if cfg.recurrence is not None else None
    caches = exact_caches(cfg, params, tokens, layout) if l_start is not None else None
    h, states = embed(cfg, params, tokens), []
    for block in range(cfg.num_layers):  # one block per call: each block's output is kept
        if block == l_start:
            h, _ = fuse(cfg, params["mixer"], h, caches, layout.control_flow, layout.positions)
        h, _ = layout_blocks(cfg, params, h, block, block + 1, layout, tokens)
        states.append(h)
    return jnp.stack(states)


# Compiled once per model config and chunk shape (static: the config), shared by every call.
jitted_layer_states = jax.jit(layer_states, static_argnums=0)


# ---------------------------------------------------------------------------------------------- probes


def probe_data(
    tokens: Int[np.ndarray, "B T"],
    segment_ids: Int[np.ndarray, "B T"],
    ks: tuple[int, ...],
    num_classes: int,
    test_fraction: float,
    seed: int,
) -> ProbeData:
    """Positions t whose x_{t+max k} lies in t's document; rows split at random into train / held-out; the
    `num_classes` most frequent targets of the training positions (over every k) as the probe's classes."""
    span = max(ks)
    inside = (segment_ids[:, :-span] != 0) & (segment_ids[:, span:] == segment_ids[:, :-span])
    rows, times = np.nonzero(inside)
    count = max(1, round(test_fraction * len(tokens)))
    held_out = np.random.default_rng(seed).permutation(len(tokens))[:count]
    test = np.isin(rows, held_out)
    targets = np.stack([tokens[rows, times + k] for k in ks])
    ids, counts = np.unique(targets[:, ~test], return_counts=True)
    classes = ids[np.argsort(-counts, kind="stable")[:num_classes]]
    lookup = np.full(int(tokens.max()) + 1, len(classes))
    lookup[classes] = np.arange(len(classes))
    return ProbeData(rows, times, lookup[targets], test, classes)


def _probe_logits(p: dict, x):
    """One probe: [B, D] -> [B, C]."""
    return jax.nn.relu(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]


# Every (layer, k) probe at once: params [L, K, ...]; a layer's input is shared by its K probes.
_grid_logits = jax.vmap(jax.vmap(_probe_logits, in_axes=(0, None)), in_axes=(0, 0))


def _nll(logits, labels):
    return optax.softmax_cross_entropy_with_integer_labels(
        logits, jnp.broadcast_to(labels, logits.shape[:-1])
    )


@functools.cache
def _probe_functions(settings: ProbeSettings, num_classes: int):
    """(init, train step, evaluation) for the settings, jitted: one step trains every (layer, k) probe."""
    optimizer = optax.adam(settings.lr)

    def init(key, layers, ks, d):
        def one(key):
            k1, k2 = jax.random.split(key)
            return {
                "w1": jax.random.normal(k1, (d, settings.hidden)) / math.sqrt(d),
                "b1": jnp.zeros(settings.hidden),
                "w2": jax.random.normal(k2, (settings.hidden, num_classes)) / math.sqrt(settings.hidden),
                "b2": jnp.zeros(num_classes),
            }

        params = jax.vmap(jax.vmap(one))(jax.random.split(key, (layers, ks)))
        return params, optimizer.init(params)

    def loss(params, x, labels):
        return _nll(_grid_logits(params, x), labels).mean(-1).sum()  # independent probes: a sum of means

    @jax.jit
    def train_step(params, opt_state, x, labels, key):
        pick = jax.random.randint(key, (settings.batch,), 0, x.shape[1])
        grads = jax.grad(loss)(params, x[:, pick], labels[:, pick])
        updates, opt_state = optimizer.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state

    @jax.jit
    def evaluate(params, x, labels, valid):
        logits = _grid_logits(params, x)
        hit = (jnp.argmax(logits, -1) == labels) & (labels < num_classes - 1) & valid  # "other" never hits
        return hit.sum(-1), (_nll(logits, labels) * valid).sum(-1)

    return jax.jit(init, static_argnums=(1, 2, 3)), train_step, evaluate


def fit_probes(
    features: Float[np.ndarray, "L N D"], data: ProbeData, settings: ProbeSettings, seed: int, desc: str
) -> dict:
    """Train the (layer, k) probes on the training positions of `features` (the states at data.rows /
    data.times) and score them on the held-out ones: {"accuracy", "loss"}, each [L, K]."""
    train_x, test_x = features[:, ~data.test], features[:, data.test]
    mean, std = train_x.mean(1, keepdims=True), train_x.std(1, keepdims=True) + 1e-6  # per layer and channel
    train_x, test_x = (train_x - mean) / std, (test_x - mean) / std
    train_y, test_y = data.labels[:, ~data.test], data.labels[:, data.test]
    init, train_step, evaluate = _probe_functions(settings, len(data.classes) + 1)
    key = jax.random.key(seed)
    params, opt_state = init(key, features.shape[0], len(data.labels), features.shape[-1])
    train_x, train_y = jnp.asarray(train_x), jnp.asarray(train_y)
    for step in tqdm(range(settings.steps), desc=desc, file=sys.stderr, leave=False):
        params, opt_state = train_step(params, opt_state, train_x, train_y, jax.random.fold_in(key, step))
    hits, nll = 0, 0
    for start in range(0, test_x.shape[1], settings.batch):  # fixed-size chunks: one compiled evaluation
        pick = np.arange(start, start + settings.batch)
        valid = pick < test_x.shape[1]
        pick = np.where(valid, pick, 0)
        chunk_hits, chunk_nll = evaluate(params, test_x[:, pick], test_y[:, pick], valid)
        hits, nll = hits + np.asarray(chunk_hits), nll + np.asarray(chunk_nll)
    return {"accuracy": hits / test_x.shape[1], "loss": nll / test_x.shape[1]}


# ---------------------------------------------------------------------------------------------- inputs


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers, got {text!r}") from None


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = OneLineParser(
        prog=SCRIPT, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
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
    from t2mlr_jax.architectures import build_architecture
    from t2mlr_jax.config_utils import shakespeare_split
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
        [build_architecture(config).backbone for config in configs],
        args.tokenizer or configs[0].data.tokenizer,
        configs,
    )


def read_rows(args: argparse.Namespace, tokenizer_path: str, vocab_size: int) -> dict:
    """args.rows rows of args.seq_len tokens of --data, as text_batches packs them (tokens and layout)."""
    from absl import flags

    from t2mlr_jax.config_utils import shakespeare_split
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
    import matplotlib

    matplotlib.use("Agg")  # files only
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
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
    plt.close(fig)


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
        **environment(args.preset, SCRIPT, argv),
        "wall_seconds": round(time.time() - started, 1),
        "ks": list(args.ks),
        "layers": layers,
        "num_layers": cfgs[0].num_layers,
        "rows": args.rows,
        "seq_len": args.seq_len,
        "data": args.data or "held-out Shakespeare plays (t2mlr_jax.config_utils.shakespeare_split)",
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


if __name__ == "__main__":
    main()
