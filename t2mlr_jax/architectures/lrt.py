"""The Latent Recurrent Transformer (LRT): the final hidden state of token t-1 fed back into every layer of
token t (Huang et al. 2026), and its latent thought tokens (the depth-versus-time paper).

Its parameters and forward passes (the memory's equations, the thought slots): lrt_forward.py.

Training is multi-refinement over the whole sequence at once: pass 0 with m = 0, then P refinement
passes, pass p with m = shift_right(final states of pass p-1) (1 + P passes in all, as the paper and the
release count: P excludes pass 0); P is drawn per step from `lrt.passes` with `lrt.pass_probs` (from
(seed, step): a resume draws the same P; each distinct P compiles once); the loss is averaged over the
supervised passes (`lrt.supervise="all"`, gradients kept across passes) or read at the last one. After
p passes positions < p are exact, so P >= T - 1 refinements equal the sequential recurrence. A thought
model draws K uniformly from `lrt.thoughts` per step too; its pass 0 over the vocabulary tokens is an
unsupervised initialisation whose state also fills each token's thought slots, then the P refinement
passes run over the N(K+1) slots. A row of data.seq_len tokens holds seq_len / (K+1) vocabulary tokens at K
(the expanded length is fixed; the rest of the row is unused that step).
Evaluation and generation run the exact recurrence token by token with the KV cache, K + 1 slots per
token at K = eval.thoughts (default: the largest trained K); `lrt.eval_mode="parallel"`: eval_passes
refinement passes instead. `lrt.feedback` ablates: both | residual | kv | none (none is the plain
backbone: the vanilla NanoChat baseline, one pass); `lrt.cross_token=False` cuts the memory of the
vocabulary slots (thought slots keep theirs; without thought slots it is refused: no memory would be left).
PonderLM-2 (ponderlm2.py) is thought slots with no feedback.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

from t2mlr_jax.architectures.contract import (
    Architecture,
    Capabilities,
    Outputs,
    backbone_config,
    cached_generate,
    layout_of,
    mlp_state_hooks,
    next_token_loss,
    register_architecture,
    row_stats,
)
from t2mlr_jax.architectures.depth_sampling import draw_at
from t2mlr_jax.architectures.lrt_forward import LRTConfig, LRTDecoder, exact_forward, lrt_specs, refine
from t2mlr_jax.architectures.thought_slots import check_thoughts, interval_tokens, vocabulary_prefix
from t2mlr_jax.config.sections import Experiment
from t2mlr_jax.model import flops
from t2mlr_jax.model.config import ModelConfig

FEEDBACK_MODES = ("both", "residual", "kv", "none")
SUPERVISE = ("all", "last")
EVAL_MODES = ("exact", "parallel")
PASSES, PASS_PROBS = (1, 2, 3, 4), (0.4, 0.3, 0.2, 0.1)  # the paper's P distribution, E[P] = 2


@dataclasses.dataclass(frozen=True)
class LRTSettings:
    """The LRT's config section `lrt` (checked against the model by `check_settings` when built)."""

    feedback: str = "both"  # both | residual | kv | none (the plain backbone)
    shared_projections: bool = False  # W_k^fb / W_v^fb shared by every layer instead of one pair per layer
    # Thought counts K drawn uniformly per training step: (0,) the LRT, (0, 1) TT1, (0, 1, 2) TT2.
    thoughts: tuple[int, ...] = (0,)
    cross_token: bool = True  # token t-1's interval's last state feeds token t (False: Table 3's ablation)
    passes: tuple[int, ...] = PASSES  # refinement pass counts P (after pass 0) sampled per training step ...
    pass_probs: tuple[float, ...] = PASS_PROBS  # ... with these probabilities
    supervise: str = "all"  # loss averaged over the supervised passes (pass 0 unless thought slots) | last
    eval_mode: str = "exact"  # teacher-forced eval: exact sequential recurrence | parallel refinement
    eval_passes: int = 4  # parallel eval only


def multi_pass_loss(supervise: str):
    """The loss of a refinement stack: every metric read at the last pass, "loss" averaged over all
    passes (supervise="all") or the last pass's; "loss_last_pass" logged either way. A batch longer than
    the logits (thought slots: fewer vocabulary tokens per row) is cut to them."""

    def loss(outputs: Outputs, batch: dict) -> dict:
        batch = vocabulary_prefix(batch, outputs.logits.shape[1])
        sums = next_token_loss(outputs, batch)
        last, tokens = sums["loss"]
        sums["loss_last_pass"] = (last, tokens)
        if supervise == "all" and outputs.pass_logits:
            earlier = sum(row_stats(logits, batch)["loss_sum"].sum() for logits in outputs.pass_logits)
            sums["loss"] = ((last + earlier) / (1 + len(outputs.pass_logits)), tokens)
        return sums

    return loss


class Draw(NamedTuple):
    """A training step's static choice: its thought count K and refinement passes P (logged as both)."""

    thoughts: int
    passes: int


def train_flops(cfg: LRTConfig, seq_len: int, draw: Draw, supervise_all: bool) -> float:
    """Training FLOPs of one row at (K, P): pass 0 over the N = seq_len / (K + 1) vocabulary tokens, then
    the P refinement passes over the N(K + 1) slots, the head at every supervised pass (pass 0 too without
    thought slots) or the last, the feedback projections (and thought gates) at every block of every pass."""
    model = cfg.model
    n = seq_len // (draw.thoughts + 1)
    kv = model.num_kv_heads
    gate = model.gate_channels * 2 * kv  # one gate set; thought slots have their own (not run in pass 0)
    fb = float(2 * model.hidden_size * kv * model.head_dim + gate) if cfg.kv else 0.0
    fb_refine = fb + (gate if cfg.kv and cfg.thought_slots else 0.0)
    supervised = draw.passes + (0 if cfg.thought_slots else 1)
    heads = (supervised if supervise_all else 1) * n
    forward = flops.pass_flops(model, n, extra_params=fb) + draw.passes * flops.pass_flops(
        model, n * (draw.thoughts + 1), extra_params=fb_refine
    )
    if cfg.growing:  # PonderLM-2's release: unsupervised passes over 1, ..., K - 1 thoughts first
        forward += sum(
            flops.pass_flops(model, n * (k + 1), extra_params=fb_refine) for k in range(1, draw.thoughts)
        )
    return flops.train(forward + flops.head_flops(model, heads))


def check_settings(s: LRTSettings, model: ModelConfig, section: str = "lrt") -> None:
    """One clear error for each bad setting of an LRT-like section, before anything is traced."""
    if s.feedback not in FEEDBACK_MODES:
        raise ValueError(f"{section}.feedback must be one of {FEEDBACK_MODES}, got {s.feedback!r}")
    if s.supervise not in SUPERVISE:
        raise ValueError(f"{section}.supervise must be one of {SUPERVISE}, got {s.supervise!r}")
    if s.eval_mode not in EVAL_MODES:
        raise ValueError(f"{section}.eval_mode must be one of {EVAL_MODES}, got {s.eval_mode!r}")
    passes, probs = tuple(s.passes), tuple(s.pass_probs)
    if not passes or any(not isinstance(p, int) or p < 1 for p in passes) or len(set(passes)) != len(passes):
        raise ValueError(f"{section}.passes must be distinct pass counts >= 1, got {passes}")
    if len(probs) != len(passes) or any(p < 0 for p in probs) or not math.isclose(sum(probs), 1.0):
        raise ValueError(
            f"{section}.pass_probs must be {len(passes)} probabilities >= 0 summing to 1 (one per "
            f"{section}.passes entry {passes}), got {probs} (sum {sum(probs):.6g})"
        )
    thoughts = tuple(s.thoughts)
    if not thoughts or len(set(thoughts)) != len(thoughts):
        raise ValueError(f"{section}.thoughts must be distinct thought counts K >= 0, got {thoughts}")
    for k in thoughts:
        check_thoughts(k, f"{section}.thoughts")
    if s.eval_passes < 1:
        raise ValueError(f"{section}.eval_passes must be >= 1, got {s.eval_passes}")
    if s.feedback in ("both", "kv") and model.gate_channels > model.hidden_size:
        raise ValueError(
            f"model.gate_channels ({model.gate_channels}) exceeds hidden_size ({model.hidden_size})"
        )


def build_lrt(
    config: Experiment,
    name: str,
    s: LRTSettings,
    *,
    section: str,
    thought_model: bool,
    embed_scale: float = 1.0,
    growing: bool = False,
) -> Architecture:
    """The LRT family from settings `s` (the lrt section, or PonderLM-2's fixed ones)."""
    model = backbone_config(config, recurrent=False)
    check_settings(s, model, section)
    thoughts, passes, probs = tuple(s.thoughts), tuple(s.passes), tuple(s.pass_probs)
    for k in thoughts:
        interval_tokens(config.data.seq_len, k, f"data.seq_len with {section}.thoughts={thoughts}")
    eval_k = max(thoughts) if config.eval.thoughts is None else config.eval.thoughts
    check_thoughts(eval_k, "eval.thoughts")
    if eval_k and not thought_model:
        raise ValueError(
            f"eval.thoughts={eval_k}: this {name} has no thought slots (lrt.thoughts={thoughts}); "
            "train it with lrt.thoughts holding a K > 0"
        )
    if not s.cross_token and not thought_model and s.feedback != "none":  # 1 + P copies of pass 0
        raise ValueError(
            f"{section}.cross_token=False cuts the only memory of an {name} without thought slots "
            f"({section}.thoughts={thoughts}): give {section}.thoughts a K > 0 (the ablation of Table 3), "
            f"or set {section}.feedback=none for the plain backbone"
        )
    cfg = LRTConfig(
        model, s.feedback, s.shared_projections, thought_model, s.cross_token, embed_scale, growing
    )
    # Evaluation and decoding never drop a token (MoE): outputs must not depend on the batch's routing.
    eval_cfg = dataclasses.replace(cfg, model=model.replace(moe_capacity_factor=None))
    plain = cfg.feedback == "none" and not thought_model  # every pass would be the same plain forward
    if plain:
        passes, probs = (0,), (1.0,)

    def apply(params, batch, *, training, rng, model_state, sample=None):
        state = model_state.get("mlp")
        if training:
            draw = sample or Draw(thoughts[0], passes[0])
            t = batch["tokens"].shape[1]
            batch = vocabulary_prefix(batch, interval_tokens(t, draw.thoughts, "a training row"))
            out = refine(cfg, params, batch["tokens"], layout_of(batch), draw.passes, state, draw.thoughts)
            return Outputs(out.logits[-1], pass_logits=out.logits[:-1], stats={"mlp": out.stats})
        if s.eval_mode == "parallel":
            n = 0 if plain else s.eval_passes
            out = refine(eval_cfg, params, batch["tokens"], layout_of(batch), n, state, eval_k)
            return Outputs(out.logits[-1])
        out = exact_forward(
            eval_cfg, params, batch["tokens"], layout_of(batch), mlp_state=state, thoughts=eval_k
        )
        return Outputs(out.logits)

    draws = [Draw(k, p) for k in thoughts for p in passes]
    weights = [w / len(thoughts) for _ in thoughts for w in probs]
    return Architecture(
        name,
        lrt_specs(cfg),
        model.param_dtype,
        apply,
        cached_generate(lambda params, model_state: (LRTDecoder(eval_cfg, eval_k), (params, model_state))),
        loss=multi_pass_loss(s.supervise),
        sample=(lambda seed, step: draw_at(draws, seed, step, weights)) if len(draws) > 1 else None,
        backbone=model,
        max_seq_len=model.max_seq_len,
        train_flops=lambda seq_len: sum(
            w * train_flops(cfg, seq_len, d, s.supervise == "all") for d, w in zip(draws, weights)
        ),
        **mlp_state_hooks(model),
    )


def _build(config: Experiment) -> Architecture:
    s = config.lrt
    return build_lrt(config, "lrt", s, section="lrt", thought_model=max(s.thoughts) > 0)


# Only the feedback's shape is the run's identity: how P and K are sampled, supervised or evaluated may
# change (thoughts: whether the thought gates exist).
register_architecture(
    "lrt",
    _build,
    settings=LRTSettings,
    identity=("feedback", "shared_projections", "thoughts"),
    capabilities=Capabilities(thought_slots=True),  # build_lrt refuses eval.thoughts without a trained K > 0
)
