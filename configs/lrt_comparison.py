"""Depth versus time (the LRT paper's Tables 1-3): every row of the comparison as a preset of one file.

  --config=configs/lrt_comparison.py:<row>,<scale>      e.g. tt1,cpu   (scale: paper (default) | cpu)

Rows (Table 1, then Table 3's ablations of the one-thought-token LRT):
  vanilla1x vanilla2x vanilla3x   the NanoChat MoE transformer at 1x / 2x / 3x the reference depth
  loop2 loop3 loop4               the reference stack applied 2 / 3 / 4 times (looped transformer)
  lrt1x lrt2x lrt3x               the LRT at 1x / 2x / 3x depth
  tt1 tt2                         the LRT with thought slots, K drawn from {0, 1} / {0, 1, 2}, evaluated at
                                  K = 1 / 2 (--config.eval.thoughts=K evaluates the same weights at any K)
  ponder1 ponder2                 PonderLM-2 with 1 / 2 thoughts
  no_cross no_kv fixed_k1         tt1 without cross-token recurrence / without KV feedback / with K = 1 fixed
  fixed_k2 fixed_k3 fixed_k4      Table 2's LRT trained at a fixed K = 2 / 3 / 4
Thought rows hold the expanded length fixed: their rows are (K_max + 1) x the reference length (at a drawn
K a row's first 1 / (K + 1) is used), the sliding windows count slots; every row is evaluated on rows of
the reference length with exact sequential recurrence (bits per byte). Table 1's protocol: the same
steps and unique data for every row of a scale (data ratio 10 at the paper scale);
--config.train.flop_budget=<FLOPs> gives each row the steps that spend that budget instead (Figure 3).

Scales: `paper` is the 16-layer reference of configs/lrt_nanochat.py (its Muon recipe, data paths to
give); `cpu` its CPU preset (offline Shakespeare, the SmolLM2 tokenizer) at 2 layers, 64 wide, 1-4
minutes per row on 2 cores: 60 steps of 4 rows, 64 held-out eval rows, and P in {1, 2} w.p. (0.5, 0.5)
instead of the paper's {1, 2, 3, 4} (every distinct (K, P) draw compiles its own train step); `study` the
cpu shapes over a 512-token BPE of the training plays (see STUDY_VOCAB) with the study's recipe
(STUDY_RECIPE), for the seeded, equal-steps, equal-data study of experiments/lrt_comparison.py
--preset=study.
experiments/lrt_comparison.py trains and tabulates the rows.
"""

import dataclasses
from pathlib import Path

from t2mlr_jax.architectures.baselines import block_order
from t2mlr_jax.config.edit import config_module, set_path
from t2mlr_jax.experiment import resolve
from t2mlr_jax.studies.recipe_rule import stable_multiplier


@dataclasses.dataclass(frozen=True)
class Row:
    label: str  # the paper's name for it
    arch: str = "lrt"
    depth: int = 1  # x the reference depth
    settings: tuple = ()  # (dotted path, value) pairs
    slots: int = 1  # K_max + 1: rows and the context are this many times the reference length


def _lrt(label, depth=1, slots=1, **lrt):
    return Row(label, "lrt", depth, tuple((f"lrt.{k}", v) for k, v in lrt.items()), slots)


ROWS = {
    "vanilla1x": _lrt("Transformer 1x", feedback="none"),
    "vanilla2x": _lrt("Transformer 2x", 2, feedback="none"),
    "vanilla3x": _lrt("Transformer 3x", 3, feedback="none"),
    **{
        f"loop{r}": Row(f"Loop Transformer, {r} loops", "looped", 1, (("looped.repeats", r),))
        for r in (2, 3, 4)
    },
    "lrt1x": _lrt("LRT 1x"),
    "lrt2x": _lrt("LRT 2x", 2),
    "lrt3x": _lrt("LRT 3x", 3),
    "tt1": _lrt("LRT + 1 thought token", slots=2, thoughts=(0, 1)),
    "tt2": _lrt("LRT + 2 thought tokens", slots=3, thoughts=(0, 1, 2)),
    "ponder1": Row("PonderLM-2, 1 thought token", "ponderlm2", 1, (("ponderlm2.thoughts", (1,)),), 2),
    "ponder2": Row("PonderLM-2, 2 thought tokens", "ponderlm2", 1, (("ponderlm2.thoughts", (2,)),), 3),
    "no_cross": _lrt("w/o cross-token recurrence", slots=2, thoughts=(0, 1), cross_token=False),
    "no_kv": _lrt("w/o KV feedback", slots=2, thoughts=(0, 1), feedback="residual"),
    **{f"fixed_k{k}": _lrt(f"fixed K = {k} training", slots=k + 1, thoughts=(k,)) for k in (1, 2, 3, 4)},
}
SCALES = ("paper", "cpu", "study")
CPU_DEPTH, CPU_WIDTH = 2, 64
# The cpu scale's budget: all 16 rows in about half an hour on 2 CPU cores, where a step's cost is mostly
# the 49,152-token head and each distinct (K, P) draw compiles its own train step (~15 s).
CPU_PASSES = ((1, 2), (0.5, 0.5))  # refinement passes P and their probabilities (paper: P in 1..4)
CPU_STEPS, CPU_BATCH = 60, 4  # the same steps for every row; 4 rows of 64 reference tokens per step
CPU_EVAL_EXAMPLES = 64  # held-out rows of 64 tokens (4k tokens), the same for every row
# The study scale (experiments/lrt_comparison.py --preset=study): the cpu shapes over a byte-level BPE of
# STUDY_VOCAB tokens trained on the training plays (the command trains it: data.tokenizer), so that the
# blocks, not the head, carry the compute, bits per byte as nanochat's evaluation counts them, 16 rows of 64
# tokens per step, 128 held-out rows; every row the same STUDY_STEPS (Tables 1-3's protocol), Figure 3's
# rows also FLOP-matched to the double-depth transformer's STUDY_STEPS.
STUDY_VOCAB = 512
STUDY_STEPS, STUDY_BATCH, STUDY_EVAL_EXAMPLES = 250, 16, 128
STUDY_REFERENCE = "vanilla2x"  # the paper's reference for training budgets
# The study's recipe, fixed before any row ran (docs/recipes.md): nanochat's rates (its 2^19-token batch
# scaling off) times one multiplier, chosen by experiments/lr_sweep.py on vanilla1x alone as the study
# trains it (its data cap too; held-out BPB, seeds 100 and 101); 20% warmup and clipping at 1.0, which
# nanochat's recipe has neither of (at 5% warmup, ending at step 12, 5 of the first study's 69 runs spiked
# above ln V right after it: docs/recipes.md); Muon's weight decay 0.2 at every depth (decay_depth 12: the
# depth rule would decay the 2-layer rows 9x the 6-layer ones). The rule's stability step
# (recipe_rule.stable_multiplier): the swept multiplier halved until every row, probed on the sweep seeds
# (lrt_comparison --preset=study --probe), trains without diverging; STABILITY_PROBES records each probe's
# diverged runs, docs/recipes.md says where and why (the thought rows' copy of their input crossing zero).
# The probes before the thought slots had their own resid / x0 scalars and optimizer.skip_unused are void
# for the rows as they are now, which started again at x0.5.
SWEPT_LR_MULTIPLIER = 0.5
STABILITY_PROBES = {0.5: 1, 0.25: 4, 0.125: 1, 0.0625: 0}
STUDY_LR_MULTIPLIER = stable_multiplier(SWEPT_LR_MULTIPLIER, STABILITY_PROBES)
STUDY_RECIPE = {
    "optimizer.lr_multiplier": STUDY_LR_MULTIPLIER,
    "optimizer.warmup_ratio": 0.2,
    "optimizer.grad_clip": 1.0,
    "optimizer.muon.decay_depth": 12,
}
DOUBLE_DEPTH_PARAMS = 1.92 * 0.805e9  # Table 1's data-ratio reference: the 2x-depth vanilla model
DATA_RATIO = 10


def _reference(scale: str):
    """configs/lrt_nanochat.py's recipe at this scale (one source of truth for the backbone and Muon)."""
    module = config_module(Path(__file__).with_name("lrt_nanochat.py"))
    return module.get_config(None if scale == "paper" else "cpu")


def get_config(arg=None):
    names = [n for n in (arg or "lrt1x").split(",") if n]
    rows, scales = [n for n in names if n in ROWS], [n for n in names if n in SCALES]
    unknown = [n for n in names if n not in ROWS and n not in SCALES]
    if unknown or len(rows) != 1 or len(scales) > 1:
        raise ValueError(
            f"lrt_comparison takes one row and at most one scale, got {arg!r}; rows: {sorted(ROWS)}, "
            f"scales: {list(SCALES)}"
        )
    row, scale = ROWS[rows[0]], (scales or ["paper"])[0]
    config = _reference(scale)
    model = config.model
    if scale in ("cpu", "study"):  # half the lrt_nanochat CPU model, so that 3x depth and 4 loops stay quick
        model.num_layers, model.hidden_size = CPU_DEPTH, CPU_WIDTH
        model.num_heads = model.num_kv_heads = CPU_WIDTH // model.head_dim
        model.mlp_dim, model.moe_dim = 4 * CPU_WIDTH, round(4 * CPU_WIDTH / 3)
        for section in ("lrt", "ponderlm2"):  # fewer distinct (K, P) draws: each compiles a train step
            config[section].passes, config[section].pass_probs = CPU_PASSES
        config.train.steps, config.train.batch_size = CPU_STEPS, CPU_BATCH
        config.eval.num_examples = CPU_EVAL_EXAMPLES
        config.train.keep_checkpoints = 1  # 16 rows x 3 checkpoints of params + Muon state: ~3 GB
    if scale == "study":
        for path, value in STUDY_RECIPE.items():
            set_path(config, path, value)
        model.vocab_size, config.data.tokenizer = STUDY_VOCAB, ""
        config.train.steps, config.train.batch_size = STUDY_STEPS, STUDY_BATCH
        config.eval.num_examples = STUDY_EVAL_EXAMPLES
        config.eval.bpb_masking, config.eval.require_bpb = "nanochat", True
    ref_len = config.data.seq_len
    if scale == "paper":  # data ratio 10 of the double-depth reference, the same steps for every row
        config.train.steps = round(DATA_RATIO * DOUBLE_DEPTH_PARAMS / (config.train.batch_size * ref_len))
    config.name = f"lrt_comparison_{rows[0]}"
    config.arch = row.arch
    model.num_layers *= row.depth
    model.max_seq_len = config.data.seq_len = row.slots * ref_len
    config.eval.window = ref_len  # every row scored on the same vocabulary contexts
    config.baseline.param_match = False
    for path, value in row.settings:
        set_path(config, path, value)
    return config


def unknown_rows(rows) -> list[str]:
    """The names in `rows` that are no row of this file (what a --rows list is checked against)."""
    return [r for r in rows if r not in ROWS]


def trained_thoughts(config) -> tuple[int, ...]:
    """The thought counts K a row's config trains with ((0,) for architectures without thought slots)."""
    section = config.get(config.arch)
    return tuple(section.thoughts) if section is not None and "thoughts" in section else (0,)


def vocab_targets_per_row(config) -> float:
    """The vocabulary tokens a training row supervises, averaged over the K drawn uniformly per step: a
    thought row of seq_len slots at K holds seq_len // (K + 1) of them (Table 2's data accounting)."""
    ks = trained_thoughts(config)
    return sum(config.data.seq_len // (k + 1) for k in ks) / len(ks)


def decode_thoughts(config) -> int:
    """The K a row is evaluated and decoded at: eval.thoughts, else its largest trained K."""
    return max(trained_thoughts(config)) if config.eval.thoughts is None else config.eval.thoughts


def decode_blocks(config) -> int:
    """Backbone blocks a row runs per decoded vocabulary token: every executed block (a loop repeats its
    range) for each of the K + 1 slots."""
    model = resolve(config).model
    blocks = model.num_layers
    if config.arch == "looped":
        loop = config.looped
        blocks = len(block_order(model, start=loop.start, end=loop.end, repeats=loop.repeats))
    return blocks * (decode_thoughts(config) + 1)
