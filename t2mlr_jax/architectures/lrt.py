"""The Latent Recurrent Transformer (LRT): the final hidden state of token t-1 fed back into every layer of
token t (Huang et al. 2026, as ../shared/spec/lrt_thought_tokens.md reads it).

Memory m_t = the final-normed hidden state of position t-1 (zeros at a document start). At every layer i:
  residual   x <- alpha_i x + beta_i x0 + gamma_i m      (alpha, beta: the backbone's resid / x0 scalars)
  keys/vals  k = g_loc W_k xn + g_fb W_k^fb m,  v = g_loc W_v xn + g_fb W_v^fb m   (before RoPE / QK-norm)
with per-kv-head gates (g_loc, g_fb) = 2 sigmoid(W_g xn[..., :C]), W_g zero-initialised (gates start at 1),
so the KV cache keeps its shape and decoding carries one d-vector per row. W^fb: per layer (~5% of the
parameters) or one pair shared by every layer (~0.3%), `lrt.shared_projections`.

Training is multi-refinement over the whole sequence at once: pass 0 with m = 0, pass p with
m = shift_right(final states of pass p-1); P passes, P drawn per step from `lrt.passes` with
`lrt.pass_probs` (from (seed, step): a resume draws the same P; each distinct P compiles once); the loss is
averaged over the passes (`lrt.supervise="all"`, gradients kept across passes) or read at the last one.
After p passes positions < p are exact, so P >= T passes equal the sequential recurrence. Evaluation and
generation run the exact recurrence token by token with the KV cache (`lrt.eval_mode="parallel"`: P =
eval_passes refinement passes instead). `lrt.feedback` ablates: both | residual | kv | none (none is
the plain backbone: the vanilla NanoChat baseline, one pass).
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
from jaxtyping import Array, Float, Int

from t2mlr_jax.architectures.contract import (
    Architecture,
    Outputs,
    backbone_config,
    cached_generate,
    layout_of,
    next_token_loss,
    register_architecture,
    row_stats,
)
from t2mlr_jax.architectures.depth_sampling import draw_at
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
from t2mlr_jax.model.layers import MLPS, layer_matrix, weight_init
from t2mlr_jax.model.params import param_specs
from t2mlr_jax.model.recurrence import Layout, Output, scan_over_tokens, shift_right
from t2mlr_jax.model.spec import ParamSpec, constant

FEEDBACK_MODES = ("both", "residual", "kv", "none")
SUPERVISE = ("all", "last")
EVAL_MODES = ("exact", "parallel")
LRT_DEFAULTS = dict(
    feedback="both",  # both | residual | kv | none (the plain backbone)
    shared_projections=False,  # W_k^fb / W_v^fb shared by every layer instead of one pair per layer
    passes=(1, 2, 3, 4),  # refinement pass counts P sampled per training step ...
    pass_probs=(0.4, 0.3, 0.2, 0.1),  # ... with these probabilities
    supervise="all",  # loss averaged over every pass | only the last pass
    eval_mode="exact",  # teacher-forced eval: exact sequential recurrence | parallel refinement
    eval_passes=4,  # parallel eval only
)


@dataclasses.dataclass(frozen=True)
class LRTConfig:
    """The static description of an LRT (hashable: a static argument of compiled functions)."""

    model: ModelConfig
    feedback: str = "both"
    shared_projections: bool = False

    @property
    def residual(self) -> bool:
        return self.feedback in ("both", "residual")

    @property
    def kv(self) -> bool:
        return self.feedback in ("both", "kv")


def lrt_specs(cfg: LRTConfig) -> dict:
    """The backbone's table plus params["lrt"]: gamma [L], the gate W_g [L, C, 2K] (local, feedback), and
    the feedback projections [L, D, K, E] (or [D, K, E] when shared), initialised like v_proj."""
    model = cfg.model
    d, k, e = model.hidden_size, model.num_kv_heads, model.head_dim
    specs = param_specs(model)
    lrt = {}
    if cfg.residual:
        lrt["gamma"] = ParamSpec((model.num_layers,), ("layers",), constant(0.1), "scalar")
    if cfg.kv:
        lrt["gate"] = layer_matrix(model, (model.gate_channels, 2 * k), ("embed", None), role="gate")
        for name in ("k_fb", "v_fb"):
            if cfg.shared_projections:
                lrt[name] = ParamSpec(
                    (d, k, e), ("embed", "kv_heads", "head_dim"), weight_init(model, "in"), "matrix", 1
                )
            else:
                lrt[name] = layer_matrix(model, (d, k, e), ("embed", "kv_heads", "head_dim"))
    return {**specs, "lrt": lrt} if lrt else specs


def _residual(p, inputs, h):
    return h + p["gamma"].astype(h.dtype) * inputs["m"]


def _kv(p, inputs, x, k, v):
    gates = kv_head_gate(x, p["gate"])[..., None]  # [B, T, 2K, 1]
    g_loc, g_fb = jnp.split(gates, 2, axis=2)
    m = inputs["m"]
    k_fb = jnp.einsum("btd,dke->btke", m, inputs.get("k_fb", p.get("k_fb")).astype(m.dtype))
    v_fb = jnp.einsum("btd,dke->btke", m, inputs.get("v_fb", p.get("v_fb")).astype(m.dtype))
    return g_loc * k + g_fb * k_fb, g_loc * v + g_fb * v_fb


def feedback(cfg: LRTConfig, params: dict, m: Float[Array, "B T D"]) -> Feedback | None:
    """The memory m hooked into every block: stacked params ride the layer scan, shared ones the inputs."""
    if cfg.feedback == "none":
        return None
    lrt = params["lrt"]
    shared = ("k_fb", "v_fb") if cfg.shared_projections and cfg.kv else ()
    return Feedback(
        {name: value for name, value in lrt.items() if name not in shared},
        {"m": m.astype(cfg.model.dtype), **{name: lrt[name] for name in shared}},
        _residual if cfg.residual else None,
        _kv if cfg.kv else None,
    )


class Passes(NamedTuple):
    logits: tuple  # each pass's logits [B, T, V], the last one last
    stats: dict  # the MLP's per-layer stats summed over the passes


def refine(
    cfg: LRTConfig,
    params: dict,
    tokens: Int[Array, "B T"],
    layout: Layout,
    num_passes: int,
    mlp_state=None,
) -> Passes:
    """Parallel multi-refinement: pass 0 with zero memory, pass p with the shifted final states of pass
    p - 1 (gradients flow through every pass)."""
    model = cfg.model
    x0 = embed(model, params, tokens)
    m = jnp.zeros_like(x0)
    logits, stats = [], None
    for _ in range(num_passes):
        out = run_blocks(
            model,
            params,
            x0,
            0,
            model.num_layers,
            positions=layout.positions,
            segment_ids=layout.segment_ids,
            feedback=feedback(cfg, params, m),
            tokens=tokens,
            mlp_state=mlp_state,
        )
        hn = final_norm(model, params, out.h)
        logits.append(unembed(model, params, hn))
        stats = out.stats if stats is None else jax.tree.map(jnp.add, stats, out.stats)
        m = shift_right(hn, layout.positions)
    return Passes(tuple(logits), stats)


def decode_step(
    cfg: LRTConfig,
    params: dict,
    tokens: Int[Array, "B T"],
    memory: Float[Array, "B D"],
    cache: KVCache,
    layout: Layout,
    mlp_state=None,
) -> Output:
    """One token (T = 1) through the cache with the previous token's memory (zero at a document start);
    returns its logits and the memory for the next token."""
    model = cfg.model
    m = jnp.where((layout.positions == 0)[..., None], 0.0, memory[:, None]).astype(model.dtype)
    out = run_blocks(
        model,
        params,
        embed(model, params, tokens),
        0,
        model.num_layers,
        positions=layout.positions,
        segment_ids=layout.segment_ids,
        cache=cache,
        feedback=feedback(cfg, params, m),
        tokens=tokens,
        mlp_state=mlp_state,
    )
    hn = final_norm(model, params, out.h)
    return Output(unembed(model, params, hn), hn[:, -1], {}, advance(out.cache, tokens.shape[1]))


def exact_forward(
    cfg: LRTConfig,
    params: dict,
    tokens: Int[Array, "B T"],
    layout: Layout,
    *,
    cache: KVCache | None = None,
    mlp_state=None,
) -> Output:
    """The sequential recurrence: `lax.scan` of `decode_step` over time with the KV cache."""
    b, t = tokens.shape
    cache = init_cache(cfg.model, b, t) if cache is None else cache
    memory = jnp.zeros((b, cfg.model.hidden_size), cfg.model.dtype)

    def step(carry, token, token_layout):
        memory, cache = carry
        out = decode_step(cfg, params, token, memory, cache, token_layout, mlp_state)
        return (out.recurrent_state, out.cache), out.logits[:, 0]

    (memory, cache), logits = scan_over_tokens(step, (memory, cache), tokens, layout)
    return Output(logits, memory, {}, cache)


@dataclasses.dataclass(frozen=True)
class LRTDecoder:
    """The LRT for `t2mlr_jax.model.generate.generate_with`; its params are (params, model_state)."""

    cfg: LRTConfig

    @property
    def model(self) -> ModelConfig:
        return self.cfg.model

    def prefill(self, params, tokens, layout, cache):
        params, model_state = params
        return exact_forward(self.cfg, params, tokens, layout, cache=cache, mlp_state=model_state.get("mlp"))

    def step(self, params, tokens, state, cache, layout):
        params, model_state = params
        return decode_step(self.cfg, params, tokens, state, cache, layout, model_state.get("mlp"))


def multi_pass_loss(supervise: str):
    """The loss of a refinement stack: every metric read at the last pass, "loss" averaged over all
    passes (supervise="all") or the last pass's; "loss_last_pass" logged either way."""

    def loss(outputs: Outputs, batch: dict) -> dict:
        sums = next_token_loss(outputs, batch)
        last, tokens = sums["loss"]
        sums["loss_last_pass"] = (last, tokens)
        if supervise == "all" and outputs.pass_logits:
            earlier = sum(row_stats(logits, batch)["loss_sum"].sum() for logits in outputs.pass_logits)
            sums["loss"] = ((last + earlier) / (1 + len(outputs.pass_logits)), tokens)
        return sums

    return loss


def check_settings(s: ml_collections.ConfigDict, model: ModelConfig) -> None:
    """One clear error for each bad `lrt` setting, before anything is traced."""
    if s.feedback not in FEEDBACK_MODES:
        raise ValueError(f"lrt.feedback must be one of {FEEDBACK_MODES}, got {s.feedback!r}")
    if s.supervise not in SUPERVISE:
        raise ValueError(f"lrt.supervise must be one of {SUPERVISE}, got {s.supervise!r}")
    if s.eval_mode not in EVAL_MODES:
        raise ValueError(f"lrt.eval_mode must be one of {EVAL_MODES}, got {s.eval_mode!r}")
    passes, probs = tuple(s.passes), tuple(s.pass_probs)
    if not passes or any(not isinstance(p, int) or p < 1 for p in passes) or len(set(passes)) != len(passes):
        raise ValueError(f"lrt.passes must be distinct pass counts >= 1, got {passes}")
    if len(probs) != len(passes) or any(p < 0 for p in probs) or not math.isclose(sum(probs), 1.0):
        raise ValueError(
            f"lrt.pass_probs must be {len(passes)} probabilities >= 0 summing to 1 (one per lrt.passes "
            f"entry {passes}), got {probs} (sum {sum(probs):.6g})"
        )
    if s.eval_passes < 1:
        raise ValueError(f"lrt.eval_passes must be >= 1, got {s.eval_passes}")
    if s.feedback in ("both", "kv") and model.gate_channels > model.hidden_size:
        raise ValueError(
            f"model.gate_channels ({model.gate_channels}) exceeds hidden_size ({model.hidden_size})"
        )


def _build(config: ml_collections.ConfigDict) -> Architecture:
    s = config.lrt
    model = backbone_config(config, recurrent=False)
    check_settings(s, model)
    cfg = LRTConfig(model, s.feedback, s.shared_projections)
    # Evaluation and decoding never drop a token (MoE): outputs must not depend on the batch's routing.
    eval_cfg = dataclasses.replace(cfg, model=model.replace(moe_capacity_factor=None))
    mlp = MLPS[model.mlp]
    passes, probs = tuple(s.passes), tuple(s.pass_probs)
    if cfg.feedback == "none":  # every pass would be the same plain forward
        passes, probs = (1,), (1.0,)

    def apply(params, batch, *, training, rng, model_state, sample=None):
        layout, state = layout_of(batch), model_state.get("mlp")
        if training or s.eval_mode == "parallel":
            run_cfg = cfg if training else eval_cfg
            n = (sample or passes[0]) if training else (1 if cfg.feedback == "none" else s.eval_passes)
            out = refine(run_cfg, params, batch["tokens"], layout, n, state)
            return Outputs(out.logits[-1], pass_logits=out.logits[:-1], stats={"mlp": out.stats})
        out = exact_forward(eval_cfg, params, batch["tokens"], layout, mlp_state=state)
        return Outputs(out.logits)

    def update_model_state(model_state, stats):
        state, metrics = mlp.update_state(model, model_state["mlp"], stats["mlp"])
        return {**model_state, "mlp": state}, metrics

    return Architecture(
        "lrt",
        lrt_specs(cfg),
        model.param_dtype,
        apply,
        cached_generate(lambda params, model_state: (LRTDecoder(eval_cfg), (params, model_state))),
        loss=multi_pass_loss(s.supervise),
        init_model_state=lambda: {} if mlp.init_state is None else {"mlp": mlp.init_state(model)},
        update_model_state=None if mlp.update_state is None else update_model_state,
        sample=(lambda seed, step: draw_at(list(passes), seed, step, list(probs)))
        if len(passes) > 1
        else None,
        sample_name="passes",
        backbone=model,
        max_seq_len=model.max_seq_len,
    )


# Only the feedback's shape is the run's identity: how P is sampled, supervised or evaluated may change.
register_architecture(
    "lrt", _build, section="lrt", defaults=LRT_DEFAULTS, identity=("feedback", "shared_projections")
)
