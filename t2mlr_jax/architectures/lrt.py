"""The Latent Recurrent Transformer (LRT): the final hidden state of token t-1 fed back into every layer of
token t (Huang et al. 2026), and its latent thought tokens (the depth-versus-time paper).

Memory m_t = the final-normed hidden state of position t-1 (zeros at a document start). At every layer i:
  residual   x <- alpha_i x + beta_i x0 + gamma_i m      (alpha, beta: the backbone's resid / x0 scalars)
  keys/vals  k = g_loc W_k xn + g_fb W_k^fb m,  v = g_loc W_v xn + g_fb W_v^fb m   (before RoPE / QK-norm)
with per-kv-head gates (g_loc, g_fb) = 2 sigmoid(W_g xn[..., :C]), W_g zero-initialised (gates start at 1),
so the KV cache keeps its shape and decoding carries one d-vector per row. W^fb: per layer (~5% of the
parameters) or one pair shared by every layer (~0.3%), `lrt.shared_projections`.

Thought tokens (`lrt.thoughts`, K per vocabulary token; t2mlr_jax.architectures.thought_slots): after
token x_t come K slots, h_t^(0) = F(E[x_t], m = h_{t-1}^(K)), h_t^(j) = F(h_t^(j-1), m = h_t^(j-1)); the
last one predicts x_{t+1} and is its memory. Vocabulary and thought slots share every projection; gamma
and the gate W_g are separate for thought slots, one set shared by every j (per-j gates would leave an
evaluation beyond the trained K without parameters). A thought slot's x0 is its input state.

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

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from t2mlr_jax.architectures.contract import (
    Architecture,
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
from t2mlr_jax.architectures.thought_slots import (
    LATENT,
    check_thoughts,
    expand,
    interval_tokens,
    last_slots,
    shift,
    vocabulary_prefix,
)
from t2mlr_jax.config.sections import Experiment
from t2mlr_jax.model import flops
from t2mlr_jax.model.backbone import (
    Feedback,
    KVCache,
    advance,
    embed,
    final_norm,
    init_cache,
    kv_head_gate,
    run_blocks,
    unembed,
)
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.layers import layer_matrix, weight_init
from t2mlr_jax.model.params import param_specs
from t2mlr_jax.model.recurrence import Layout, Output, scan_over_tokens
from t2mlr_jax.model.spec import ParamSpec, constant

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


@dataclasses.dataclass(frozen=True)
class LRTConfig:
    """The static description of an LRT (hashable: a static argument of compiled functions)."""

    model: ModelConfig
    feedback: str = "both"
    shared_projections: bool = False
    thought_slots: bool = False  # trained with thought slots: own thought gates, pass 0 unsupervised
    cross_token: bool = True
    embed_scale: float = 1.0  # vocabulary embeddings x this (PonderLM-2's option)

    @property
    def residual(self) -> bool:
        return self.feedback in ("both", "residual")

    @property
    def kv(self) -> bool:
        return self.feedback in ("both", "kv")


def lrt_specs(cfg: LRTConfig) -> dict:
    """The backbone's table plus params["lrt"]: gamma [L], the gate W_g [L, C, 2K] (local, feedback), the
    thought slots' own gamma_thought / gate_thought, and the feedback projections [L, D, K, E] (or
    [D, K, E] when shared), initialised like v_proj."""
    model = cfg.model
    d, k, e = model.hidden_size, model.num_kv_heads, model.head_dim
    specs = param_specs(model)
    kinds = ("", "_thought") if cfg.thought_slots else ("",)
    lrt = {}
    if cfg.residual:
        for kind in kinds:
            lrt["gamma" + kind] = ParamSpec((model.num_layers,), ("layers",), constant(0.1), "scalar")
    if cfg.kv:
        for kind in kinds:
            lrt["gate" + kind] = layer_matrix(
                model, (model.gate_channels, 2 * k), ("embed", None), role="gate"
            )
        for name in ("k_fb", "v_fb"):
            if cfg.shared_projections:
                lrt[name] = ParamSpec(
                    (d, k, e), ("embed", "kv_heads", "head_dim"), weight_init(model, "in"), "matrix", 1
                )
            else:
                lrt[name] = layer_matrix(model, (d, k, e), ("embed", "kv_heads", "head_dim"))
    return {**specs, "lrt": lrt} if lrt else specs


def _own(p: dict, inputs: dict, name: str, value_of):
    """value_of(param) for this slot: the thought slots' own parameter where the call has thought slots."""
    value = value_of(p[name])
    if "thought" not in inputs:
        return value
    thought = inputs["thought"].reshape(inputs["thought"].shape + (1,) * (value.ndim - 2))
    return jnp.where(thought, value_of(p[name + "_thought"]), value)


def _residual(p, inputs, h):
    gamma = _own(p, inputs, "gamma", lambda g: jnp.broadcast_to(g, h.shape[:2]))[..., None]
    return h + gamma.astype(h.dtype) * inputs["m"]


def _kv(p, inputs, x, k, v):
    gates = _own(p, inputs, "gate", lambda w: kv_head_gate(x, w))[..., None]  # [B, T, 2K, 1]
    g_loc, g_fb = jnp.split(gates, 2, axis=2)
    m = inputs["m"]
    k_fb = jnp.einsum("btd,dke->btke", m, inputs.get("k_fb", p.get("k_fb")).astype(m.dtype))
    v_fb = jnp.einsum("btd,dke->btke", m, inputs.get("v_fb", p.get("v_fb")).astype(m.dtype))
    return g_loc * k + g_fb * k_fb, g_loc * v + g_fb * v_fb


def feedback(
    cfg: LRTConfig, params: dict, m: Float[Array, "B T D"], thought: Bool[Array, "B T"] | None = None
) -> Feedback | None:
    """The memory m hooked into every block: stacked params ride the layer scan, shared ones the inputs;
    `thought` marks the slots that use the thought gates (thought models only)."""
    if cfg.feedback == "none":
        return None
    lrt = params["lrt"]
    shared = ("k_fb", "v_fb") if cfg.shared_projections and cfg.kv else ()
    inputs = {"m": m.astype(cfg.model.dtype), **{name: lrt[name] for name in shared}}
    if cfg.thought_slots and thought is not None:
        inputs["thought"] = thought
    return Feedback(
        {name: value for name, value in lrt.items() if name not in shared},
        inputs,
        _residual if cfg.residual else None,
        _kv if cfg.kv else None,
    )


def vocab_inputs(cfg: LRTConfig, params: dict, tokens: Int[Array, "B T"]) -> Float[Array, "B T D"]:
    x = embed(cfg.model, params, tokens)
    return x if cfg.embed_scale == 1.0 else (x * cfg.embed_scale).astype(x.dtype)


def _run(cfg: LRTConfig, params, h, tokens, layout: Layout, m, thought, mlp_state, cache=None):
    """One backbone pass over slots (h their input, also x0) with memory m: (final-normed states, out)."""
    model = cfg.model
    out = run_blocks(
        model,
        params,
        h,
        0,
        model.num_layers,
        positions=layout.positions,
        segment_ids=layout.segment_ids,
        cache=cache,
        feedback=feedback(cfg, params, m, thought),
        tokens=tokens,
        x0=h,
        mlp_state=mlp_state,
    )
    return final_norm(model, params, out.h), out


class Passes(NamedTuple):
    logits: tuple  # each supervised pass's logits [B, T, V], the last one last
    stats: dict  # the MLP's per-layer stats summed over the passes


def refine(
    cfg: LRTConfig,
    params: dict,
    tokens: Int[Array, "B T"],
    layout: Layout,
    refinements: int,
    mlp_state=None,
    thoughts: int = 0,
) -> Passes:
    """Parallel multi-refinement: pass 0, then `refinements` passes (gradients flow through every pass).

    Pass 0 runs the vocabulary tokens with zero memory. The plain LRT supervises it, then refines,
    each pass with m = the final states of the pass before, shifted one token. A thought model takes
    pass 0 as the unsupervised initialisation, puts each token's state on its K thought slots too, and
    refines the N(K+1) slots: a vocabulary slot's input is its embedding, a
    thought slot's the shifted state; the memory is the shifted state (zero at vocabulary slots without
    cross-token feedback). Logits are read at each interval's last slot.
    """
    model = cfg.model
    x = vocab_inputs(cfg, params, tokens)
    states, out = _run(cfg, params, x, tokens, layout, jnp.zeros_like(x), None, mlp_state)
    stats = out.stats
    logits = [] if cfg.thought_slots else [unembed(model, params, states)]
    slots = expand(tokens, layout, thoughts)
    inputs = jnp.repeat(x, thoughts + 1, axis=1)
    states = jnp.repeat(states, thoughts + 1, axis=1)
    thought = slots.thought[..., None]
    for _ in range(refinements):
        previous = shift(states, slots.starts)
        m = previous if cfg.cross_token else jnp.where(thought, previous, 0.0).astype(previous.dtype)
        h = jnp.where(thought, previous, inputs)
        states, out = _run(cfg, params, h, slots.tokens, slots.layout, m, slots.thought, mlp_state)
        stats = jax.tree.map(jnp.add, stats, out.stats)
        logits.append(unembed(model, params, last_slots(states, thoughts)))
    return Passes(tuple(logits), stats)


def decode_step(
    cfg: LRTConfig,
    params: dict,
    tokens: Int[Array, "B 1"],
    memory: Float[Array, "B D"],
    cache: KVCache,
    layout: Layout,
    mlp_state=None,
    thoughts: int = 0,
) -> Output:
    """One vocabulary token and its K thought slots through the cache (K + 1 slots): the token's slot
    with the previous interval's last state as memory (zero at a document start, or without cross-token
    feedback), then each thought slot fed the previous slot's state as input and memory. Returns the
    last slot's logits and state (the next token's memory)."""
    model = cfg.model
    keep = (layout.positions != 0)[..., None] & cfg.cross_token
    m = jnp.where(keep, memory[:, None], 0.0).astype(model.dtype)

    def slot(h, slot_tokens, m, thought, cache):
        hn, out = _run(cfg, params, h, slot_tokens, layout, m, thought, mlp_state, cache)
        return hn, advance(out.cache, 1)

    hn, cache = slot(vocab_inputs(cfg, params, tokens), tokens, m, jnp.zeros(tokens.shape, bool), cache)
    latent, thought = jnp.full_like(tokens, LATENT), jnp.ones(tokens.shape, bool)
    hn, cache = jax.lax.fori_loop(
        0, thoughts, lambda _, carry: slot(carry[0], latent, carry[0], thought, carry[1]), (hn, cache)
    )
    return Output(unembed(model, params, hn), hn[:, -1], {}, cache)


def exact_forward(
    cfg: LRTConfig,
    params: dict,
    tokens: Int[Array, "B T"],
    layout: Layout,
    *,
    cache: KVCache | None = None,
    mlp_state=None,
    thoughts: int = 0,
) -> Output:
    """The sequential recurrence: `lax.scan` of `decode_step` over time with a KV cache of T(K+1) slots."""
    b, t = tokens.shape
    cache = init_cache(cfg.model, b, t * (thoughts + 1)) if cache is None else cache
    memory = jnp.zeros((b, cfg.model.hidden_size), cfg.model.dtype)

    def step(carry, token, token_layout):
        memory, cache = carry
        out = decode_step(cfg, params, token, memory, cache, token_layout, mlp_state, thoughts)
        return (out.recurrent_state, out.cache), out.logits[:, 0]

    (memory, cache), logits = scan_over_tokens(step, (memory, cache), tokens, layout)
    return Output(logits, memory, {}, cache)


@dataclasses.dataclass(frozen=True)
class LRTDecoder:
    """The LRT for `t2mlr_jax.model.generate.generate_with`; its params are (params, model_state)."""

    cfg: LRTConfig
    thoughts: int = 0

    @property
    def model(self) -> ModelConfig:
        return self.cfg.model

    def init_cache(self, batch, num_tokens):
        return init_cache(self.model, batch, num_tokens * (self.thoughts + 1))

    def prefill(self, params, tokens, layout, cache):
        params, model_state = params
        return exact_forward(
            self.cfg,
            params,
            tokens,
            layout,
            cache=cache,
            mlp_state=model_state.get("mlp"),
            thoughts=self.thoughts,
        )

    def step(self, params, tokens, state, cache, layout):
        params, model_state = params
        return decode_step(
            self.cfg, params, tokens, state, cache, layout, model_state.get("mlp"), self.thoughts
        )


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
    cfg = LRTConfig(model, s.feedback, s.shared_projections, thought_model, s.cross_token, embed_scale)
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
        thought_slots=thought_model,
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
)
