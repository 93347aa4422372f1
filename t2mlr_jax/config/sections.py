"""The experiment, typed: one frozen dataclass per config section, with its defaults and its checks.

`Experiment` is what everything below main.py receives. Its core sections are defined here; each registered
component brings its own settings dataclass (`register_section`): an architecture a top-level section
(`register_architecture`), an optimizer or a schedule one under `optimizer` (`register_optimizer`,
`register_schedule`), each reached as an attribute like the core ones (`experiment.t2mlr`,
`experiment.optimizer.muon`). Values are checked when an object is built, so a bad
value is one clear error before anything is traced or compiled; `t2mlr_jax.config.convert` is the one
conversion to and from the ml_collections ConfigDict that config files and --config.a.b=v edit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.parallel.rules import MESH_AXES, ZERO_STAGES
from t2mlr_jax.registry import Registry, did_you_mean

# Every section a registered component brings: its dotted path ("t2mlr", "optimizer.muon") -> its frozen
# settings dataclass.
SECTIONS: Registry = Registry("config section")


def register_section(path: str, settings: type) -> None:
    if not (dataclasses.is_dataclass(settings) and settings.__dataclass_params__.frozen):
        raise TypeError(f"config section {path!r}: its settings must be a frozen dataclass, got {settings!r}")
    SECTIONS.register(path, settings)


RECURRENCE = "model.recurrence"  # the temporal recurrence a ModelConfig carries (T²MLR's RecurrenceConfig)


def recurrence_settings() -> type:
    """The registered dataclass of `model.recurrence`; registered by the system that runs it (importing
    t2mlr_jax.architectures registers T²MLR's), so reading a stored or edited model needs that import."""
    if RECURRENCE not in SECTIONS:
        raise ValueError(f"{RECURRENCE}: no recurrence is registered (import t2mlr_jax.architectures first)")
    return SECTIONS.get(RECURRENCE)


def sections_under(parent: str) -> dict[str, type]:
    """The registered sections directly under `parent` ("" = the top level), by name."""
    found = {}
    for path, settings in SECTIONS.items():
        above, _, name = path.rpartition(".")
        if above == parent:
            found[name] = settings
    return dict(sorted(found.items()))


class Sectioned:
    """A section that also holds the registered sections under it (its `sections` field, by name), each
    read as an attribute. `PARENT` is its path ("" for the experiment)."""

    PARENT = ""

    @classmethod
    def default_sections(cls) -> dict:
        return {name: settings() for name, settings in sections_under(cls.PARENT).items()}

    def __getattr__(self, name: str):
        sections = self.__dict__.get("sections") or {}
        if name in sections:
            return sections[name]
        known = [*sections, *(f.name for f in dataclasses.fields(self))]
        where = f"section {self.PARENT!r}" if self.PARENT else "experiment"
        raise AttributeError(f"the {where} has no field or section {name!r}{did_you_mean(name, known)}")

    def replace(self, **changes):
        """A copy with fields or sections replaced; a dict for a section updates only the fields it names,
        at any depth: replace(train={"steps": 3}, optimizer={"muon": {"matrix_lr": 0.01}})."""
        names = {f.name for f in dataclasses.fields(self)}
        updates, sections = {}, dict(self.sections)
        for key, value in changes.items():
            current = getattr(self, key)
            if isinstance(value, Mapping) and dataclasses.is_dataclass(current):
                sectioned = isinstance(current, Sectioned)
                value = current.replace(**value) if sectioned else dataclasses.replace(current, **value)
            if key in names:
                updates[key] = value
            else:
                sections[key] = value
        return dataclasses.replace(self, **updates, sections=sections)


def non_negative_rates(where: str, settings) -> None:
    """Every learning rate (a field named lr, lr_multiplier, *_lr or *_lr_multiplier) >= 0 and finite: a
    negative rate would ascend the loss without a word."""
    for field in dataclasses.fields(settings):
        value = getattr(settings, field.name)
        if (field.name in ("lr", "lr_multiplier") or field.name.endswith(("_lr", "_lr_multiplier"))) and not (
            0 <= float(value) < float("inf")
        ):
            raise ValueError(f"{where}.{field.name} must be >= 0 (and finite), got {value}")


def one_of(where: str, value, choices) -> None:
    """The shared check of a field that names one of a fixed set."""
    if value not in choices:
        raise ValueError(f"{where} must be one of {tuple(choices)}, got {value!r}")


def at_least(where: str, value, low) -> None:
    if value < low:
        raise ValueError(f"{where} must be >= {low}, got {value}")


def profile_window(where: str, text: str) -> tuple[int, int] | None:
    """ "START:STOP" -> (START, STOP), the steps START .. STOP - 1 (1 <= START < STOP); "" -> None."""
    if not text:
        return None
    start, sep, stop = text.partition(":")
    if not (sep and start.strip().isdigit() and stop.strip().isdigit() and 1 <= int(start) < int(stop)):
        raise ValueError(f"{where} must be START:STOP with 1 <= START < STOP (e.g. 10:13), got {text!r}")
    return int(start), int(stop)


@dataclasses.dataclass(frozen=True)
class Mesh:
    """Device mesh (t2mlr_jax.parallel): the axes' sizes, -1 = all remaining devices, and the ZeRO stage."""

    data: int = -1
    fsdp: int = 1
    expert: int = 1  # MoE's experts
    tensor: int = 1
    # 3: weights and optimizer state over fsdp (ZeRO-3 / FSDP); 1: weights whole on every chip, optimizer
    # state over data and fsdp (ZeRO-1), where the weights fit (t2mlr_jax.parallel.rules.ZERO_STAGES)
    zero: int = 3

    def __post_init__(self):
        one_of("mesh.zero", self.zero, ZERO_STAGES)

    def sizes(self) -> dict[str, int]:
        """The mesh axes' sizes, as `make_mesh` takes them."""
        return {axis: getattr(self, axis) for axis in MESH_AXES}


@dataclasses.dataclass(frozen=True)
class Baseline:
    """How backbone baselines are sized."""

    param_match: bool = True  # widen backbone baselines to the T²MLR parameter count (not with init_from)
    width_multiple: int = 8  # ... in steps of this many channels (the release's 135M baseline: 576 -> 584)

    def __post_init__(self):
        at_least("baseline.width_multiple", self.width_multiple, 1)


@dataclasses.dataclass(frozen=True)
class Optimizer(Sectioned):
    """The optimizer (`name`, registered in t2mlr_jax.train.optimizer), its LR schedule (`schedule`,
    likewise) and clipping. What only one optimizer or schedule reads is in its own section under this one
    (optimizer.adamw.weight_decay, optimizer.muon.matrix_lr, optimizer.wsd.decay_steps)."""

    PARENT = "optimizer"

    name: str = "adamw"  # adamw | muon
    lr: float = 5e-4  # the schedule's peak (adamw: its lr; muon: only normalises, multiplier = schedule / lr)
    # every rate of the recipe x this (adamw's lr, each muon group's): the one knob an LR sweep turns
    # (experiments/lr_sweep.py), so that a recipe's rates keep their ratios
    lr_multiplier: float = 1.0
    schedule: str = "cosine"  # cosine | wsd | constant | linear_decay
    warmup_ratio: float = 0.05
    min_lr_ratio: float = 0.01
    grad_clip: float = 1.0
    gate_lr_multiplier: float = 1.0
    sections: Mapping[str, Any] = dataclasses.field(default_factory=lambda: Optimizer.default_sections())

    def __post_init__(self):
        non_negative_rates("optimizer", self)


NAN_POLICIES = ("stop", "skip")


@dataclasses.dataclass(frozen=True)
class Train:
    steps: int = 1000
    batch_size: int = 16
    grad_accum: int = 1
    log_every: int = 50
    eval_every: int = 0  # 0 = evaluate at the end only
    checkpoint_every: int = 500
    keep_checkpoints: int = 2
    async_checkpoint: bool = True
    progress: bool = True
    # > 0: train.steps = round(flop_budget / the architecture's expected training FLOPs per step)
    # (FLOP-matched comparisons; t2mlr_jax.model.flops); 0 = train.steps as given
    flop_budget: float = 0.0
    # > 0: train.steps = ceil(epochs x (training examples // batch_size)), as HF's num_train_epochs
    # (generated tasks count data.train_examples, files their rows); 0 = train.steps as given
    epochs: float = 0.0
    # a step with a non-finite loss or gradient norm is never applied; "stop" ends the run (exit status 1,
    # the last checkpoint intact), "skip" logs it and goes on, at most nan_skip_limit times
    nan_policy: str = "stop"
    nan_skip_limit: int = 10
    # resume from a checkpoint whose optimizer state does not fit the configured optimizer: keep its
    # parameters, start a fresh optimizer state (otherwise such a resume is refused)
    reset_optimizer: bool = False
    # every checkpoint in the workdir unreadable: refused (nothing moved), unless True: set them aside to
    # corrupt_checkpoints/ and train from step 0
    restart_if_all_corrupt: bool = False
    # "START:STOP": a jax.profiler trace of steps START .. STOP - 1 into WORKDIR/profile/ (TensorBoard's
    # profile plugin, Perfetto; tools/report.py names its slowest ops); "" = none
    profile: str = ""

    @property
    def profile_steps(self) -> tuple[int, int] | None:
        """train.profile as (START, STOP), None when off."""
        return profile_window("train.profile", self.profile)

    def __post_init__(self):
        window = self.profile_steps
        if window and not (self.epochs or self.flop_budget) and window[1] - 1 > self.steps:
            raise ValueError(f"train.profile {self.profile} ends past train.steps ({self.steps})")
        if (self.steps < 1 and not self.epochs) or self.batch_size < 1 or self.grad_accum < 1:
            raise ValueError(
                "train.steps (unless set by train.epochs), train.batch_size and train.grad_accum must be >= 1"
            )
        one_of("train.nan_policy", self.nan_policy, NAN_POLICIES)
        if self.batch_size % self.grad_accum:
            raise ValueError(
                f"train.batch_size ({self.batch_size}) must be divisible by "
                f"train.grad_accum ({self.grad_accum})"
            )
        if self.epochs < 0 or (self.epochs and self.flop_budget):
            raise ValueError(
                f"train.epochs must be >= 0 and not combined with train.flop_budget, got {self.epochs}"
            )
        at_least("train.flop_budget (0 = off)", self.flop_budget, 0)


DATA_KINDS = ("generated", "file", "text")


@dataclasses.dataclass(frozen=True)
class Data:
    """What to train and evaluate on (t2mlr_jax.train.build_data)."""

    kind: str = "generated"  # generated | file | text
    task: str = ""
    format: str = ""  # generated task name / record format of files
    tokenizer: str = ""
    train_path: str = ""
    eval_path: str = ""
    # kind "text": a prepared TFDS split "tfds:NAME[/CONFIG]:SPLIT" (e.g. "tfds:c4/en:train") in place of
    # train_path / eval_path; "" = the path (t2mlr_jax.data.tfds_source)
    source: str = ""
    eval_source: str = ""
    tfds_data_dir: str = ""  # the prepared array_record copies; "" = TFDS's default (~/tensorflow_datasets)
    tfds_text_key: str = "text"  # the string feature that holds each document
    hint: str = ""  # how to get this config's data: ends the error when a data or tokenizer path is missing
    seq_len: int = 256
    train_examples: int = 1_000_000
    # kind "text": train on only the stream's first this many tokens (EOS counted), revisited epoch after
    # epoch, so that rows reading more per step see the same unique text (the studies' equal data); 0 = all
    train_tokens: int = 0
    eval_split: str = "test"
    # how examples fill rows (t2mlr_jax.data.pipeline): tasks / files "none" (one per row) or "documents"
    # (packed whole); text "documents" (each its own segment: attention, positions and R restart at every
    # document) or "concat" (the release's: one stream, nothing restarts). "" = by kind, as just said.
    packing: str = ""
    chat: bool = False
    all_recurrent: bool = False
    prompt_loss: bool = False
    worker_count: int = 0
    # The task generator's own fields, for both splits and for the eval split only (over `options`).
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    eval_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        one_of("data.kind", self.kind, DATA_KINDS)
        if not self.packing:
            object.__setattr__(self, "packing", "documents" if self.kind == "text" else "none")
        at_least("data.seq_len", self.seq_len, 1)
        at_least("data.train_tokens", self.train_tokens, 0)
        if self.train_tokens and self.kind != "text":
            raise ValueError(f'data.train_tokens is for data.kind="text", not {self.kind!r}')


BPB_MASKINGS = ("loss_mask", "nanochat")


@dataclasses.dataclass(frozen=True)
class Eval:
    batch_size: int = 64
    num_examples: int = 512
    # tokens per eval row (text: non-overlapping windows of this many tokens, the paper's protocol is
    # 1024); 0 = data.seq_len
    window: int = 0
    generate: bool = False  # greedy-generation exact match (SFT tasks); off = per-position argmax (S5)
    max_new_tokens: int = 64
    # how generation picks tokens: greedy at temperature 0, else one sample per prompt after top-k (0 = off)
    # and top-p (1 = off) filtering, its keys drawn from the config's seed
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    score: str = "loss_mask"  # positions scored for accuracy / exact match: loss_mask | recurrent (S5)
    # The targets whose loss counts in bits per byte's numerator (its denominator, their UTF-8 bytes, is
    # the same either way): "loss_mask", every supervised target, a zero-byte one (a special token such as
    # <|bos|>) included: ours so far, the default so that earlier figures stay comparable; "nanochat",
    # only targets of at least one byte, as nanochat's (and the LRT release's) evaluate_bpb, which a later
    # protocol will make the default. Evaluation's bpb only: the training log's bpb stays loss_mask's.
    bpb_masking: str = "loss_mask"
    # the studies' protocol: bits per byte must be defined (a byte-level text tokenizer), else the run stops
    # with one line before anything compiles
    require_bpb: bool = False
    # latent thought slots per vocabulary token when evaluating / generating (architectures with thought
    # slots: lrt, ponderlm2); None = the largest trained count
    thoughts: int | None = None
    # --mode=eval also runs these lm-evaluation-harness tasks (comma list, e.g. "arc_easy,piqa";
    # t2mlr_jax.train.lm_eval_bridge), from lm-eval's index or YAML files under lm_eval_include_path;
    # lm_eval_limit > 0 caps the documents per task; an empty context is conditioned on
    # lm_eval_prefix_token_id (None: the tokenizer's BOS, else its EOS, as lm-eval's `hf` model)
    lm_eval_tasks: str = ""
    lm_eval_limit: int = 0
    lm_eval_fewshot: int = 0
    lm_eval_include_path: str = ""
    lm_eval_prefix_token_id: int | None = None

    def __post_init__(self):
        one_of("eval.bpb_masking", self.bpb_masking, BPB_MASKINGS)


# The core sections, by name (their order is the config's).
CORE = dict(mesh=Mesh, baseline=Baseline, optimizer=Optimizer, train=Train, data=Data, eval=Eval)


@dataclasses.dataclass(frozen=True)
class Experiment(Sectioned):
    """One experiment: what to train (`arch`, `model`, the architectures' sections), on what (`data`), how
    (`optimizer`, `train`, `mesh`) and how it is measured (`eval`)."""

    name: str
    model: ModelConfig  # with `model.recurrence` (T²MLR's); baselines drop it
    arch: str = "t2mlr"  # a registered architecture, or a comma list to train each and compare them
    seed: int = 42
    # A pretrained checkpoint to start from (HF folder, .gguf, authors' T²MLR folder or orbax), retrofitted
    # with fresh fusion parameters (γ = 0) when the model is T²MLR; "" or "random" = random initialisation.
    # init_from_required (the finetuning recipes): such a run refuses to train without a checkpoint (unset,
    # or --config.init_from=), unless told "random" on purpose.
    init_from: str | None = ""
    init_from_required: bool = False
    # The persistent XLA compilation cache (a rerun loads its compiled steps instead of compiling them):
    # "auto" = ~/.cache/t2mlr_jax/xla (t2mlr_jax.train.compilation_cache); a directory = there; "" = off.
    # One already configured (JAX_COMPILATION_CACHE_DIR) wins.
    compilation_cache: str = "auto"
    mesh: Mesh = Mesh()
    baseline: Baseline = Baseline()
    optimizer: Optimizer = dataclasses.field(default_factory=Optimizer)  # its sections: registered later
    train: Train = Train()
    data: Data = Data()
    eval: Eval = Eval()
    # The architectures' own sections (SECTIONS), by name: read as experiment.<name>.
    sections: Mapping[str, Any] = dataclasses.field(default_factory=lambda: Experiment.default_sections())

    def __post_init__(self):
        d, t = self.data, self.train
        if 0 < d.train_tokens < t.batch_size * d.seq_len:
            raise ValueError(
                f"data.train_tokens={d.train_tokens} is less than one batch ({t.batch_size * d.seq_len} = "
                "train.batch_size x data.seq_len)"
            )
