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
`lrt.training="interleaved"` trains as the LRT release does instead (OoDBag/Latent_recurrent_transformer's
parallel interleaved training, lrt_forward.interleaved): pass 0, then `lrt.interleaved_num_passes` = N
passes, pass i rerunning only the positions t % N == i against the earlier passes' keys / values with the
freshest memory (`lrt.interleaved_kv_refresh`: the keys / values of the positions not rerun yet are
re-projected from it before each pass); the loss is the mean of the 1 + N passes' mean cross-entropies
(no thought slots).
Multi-refinement stays the default: it is the seed paper's, whose results we reproduce.
PonderLM-2 (ponderlm2.py) is thought slots with no feedback.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax.numpy as jnp

from t2mlr_jax.architectures.contract import (
    Architecture,
    CachedGenerate,
    Capabilities,
    Outputs,
    layout_of,
    mlp_state_hooks,
    next_token_loss,
    register_architecture,
    row_stats,
)
from t2mlr_jax.architectures.depth_sampling import draw_at
from t2mlr_jax.architectures.lrt.forward import (
    LRTConfig,
    LRTDecoder,
    exact_forward,
    interleaved,
    lrt_specs,
    refine,
)
from t2mlr_jax.architectures.lrt.thought_slots import (
    batch_positions,
    check_thoughts,
    interval_tokens,
    vocabulary_prefix,
)
from t2mlr_jax.config.sections import Experiment
from t2mlr_jax.model import flops
from t2mlr_jax.model.config import ModelConfig

FEEDBACK_MODES = ("both", "residual", "kv", "none")
SUPERVISE = ("all", "last")
EVAL_MODES = ("exact", "parallel")
TRAINING = ("refinement", "interleaved")
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
    training: str = "refinement"  # multi-refinement (the seed paper's) | interleaved (the LRT release's)
    interleaved_num_passes: int = 2  # interleaved training: N passes after the full one (the release's name)
    interleaved_kv_refresh: bool = False  # ... with the release's cheap KV refresh before each pass


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


def interleaved_loss(passes: int):
    """The loss of interleaved training as the release computes it: the mean over its 1 + N passes of
    each pass's mean cross-entropy (pass 0's over every position, interleaved pass i's over the positions
    t % N == i of the merged logits); every other metric read at the merged logits, which are also
    "loss_last_pass"."""

    def loss(outputs: Outputs, batch: dict) -> dict:
        sums = next_token_loss(outputs, batch)
        sums["loss_last_pass"] = sums["loss"]

        def mean(logits, batch):
            rows = row_stats(logits, batch)
            return rows["loss_sum"].sum() / jnp.maximum(rows["tokens"].sum(), 1.0)

        means = [mean(outputs.pass_logits[0], batch)] + [
            mean(outputs.logits[:, i::passes], batch_positions(batch, slice(i, None, passes)))
            for i in range(passes)
        ]
        tokens = sums["loss"][1]
        sums["loss"] = (tokens * sum(means) / len(means), tokens)
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
    if s.training not in TRAINING:
        raise ValueError(f"{section}.training must be one of {TRAINING}, got {s.training!r}")
    if s.interleaved_num_passes < 1:
        raise ValueError(f"{section}.interleaved_num_passes must be >= 1, got {s.interleaved_num_passes}")
    if s.interleaved_kv_refresh and s.training != "interleaved":
        raise ValueError(
            f"{section}.interleaved_kv_refresh=True is a setting of {section}.training='interleaved'"
        )
    if s.training == "interleaved":
        refused = {
            "thoughts": (tuple(s.thoughts) != (0,), "it has no thought slots"),
            "feedback": (s.feedback == "none", "it trains the feedback"),
            "supervise": (s.supervise != "all", "it averages every pass, as the release does"),
            "interleaved_kv_refresh": (
                s.interleaved_kv_refresh and s.feedback not in ("both", "kv"),
                f"it re-projects the keys / values' feedback, which feedback={s.feedback!r} has not",
            ),
        }
        for name, (bad, why) in refused.items():
            if bad:
                raise ValueError(
                    f"{section}.{name}={getattr(s, name)!r} with {section}.training='interleaved': {why}"
                )
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
    model = config.model.replace(recurrence=None)
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
    interleaved_training = s.training == "interleaved"
    if interleaved_training:
        if s.interleaved_num_passes > config.data.seq_len:
            raise ValueError(
                f"{section}.interleaved_num_passes={s.interleaved_num_passes} exceeds data.seq_len "
                f"({config.data.seq_len}): an interleaved pass would have no position"
            )
        passes, probs = (s.interleaved_num_passes,), (1.0,)

    def apply(params, batch, *, training, rng, model_state, sample=None):
        state = model_state.get("mlp")
        if training:
            draw = sample or Draw(thoughts[0], passes[0])
            t = batch["tokens"].shape[1]
            batch = vocabulary_prefix(batch, interval_tokens(t, draw.thoughts, "a training row"))
            if interleaved_training:
                out = interleaved(
                    cfg,
                    params,
                    batch["tokens"],
                    layout_of(batch),
                    draw.passes,
                    state,
                    s.interleaved_kv_refresh,
                )
            else:
                out = refine(
                    cfg, params, batch["tokens"], layout_of(batch), draw.passes, state, draw.thoughts
                )
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
    # interleaved training's N passes together rerun each position once: one refinement's FLOPs
    flops_draws = [Draw(0, 1)] if interleaved_training else draws
    loss = interleaved_loss(passes[0]) if interleaved_training else multi_pass_loss(s.supervise)
    return Architecture(
        name,
        lrt_specs(cfg),
        model.param_dtype,
        apply,
        CachedGenerate(lambda params, model_state: (LRTDecoder(eval_cfg, eval_k), (params, model_state))),
        loss=loss,
        sample=(lambda seed, step: draw_at(draws, seed, step, weights)) if len(draws) > 1 else None,
        backbone=model,
        max_seq_len=model.max_seq_len,
        train_flops=lambda seq_len: sum(
            w * train_flops(cfg, seq_len, d, s.supervise == "all") for d, w in zip(flops_draws, weights)
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
