"""The LRT's parameters and forward passes (its settings, sampling, loss and registration: lrt.py).

Memory m_t = the final-normed hidden state of position t-1 (zeros at a document start). At every layer i:
  residual   x <- alpha_i x + beta_i x0 + gamma_i m      (alpha, beta: the backbone's resid / x0 scalars)
  keys/vals  k = g_loc W_k xn + g_fb W_k^fb m,  v = g_loc W_v xn + g_fb W_v^fb m   (before RoPE / QK-norm)
with per-kv-head gates (g_loc, g_fb) = 2 sigmoid(W_g xn[..., :C]), W_g zero-initialised (gates start at 1),
so the KV cache keeps its shape and decoding carries one d-vector per row. W^fb: per layer (~5% of the
parameters) or one pair shared by every layer (~0.3%), `lrt.shared_projections`.

Thought tokens (`lrt.thoughts`, K per vocabulary token; t2mlr_jax.architectures.lrt.thought_slots): after
token x_t come K slots, h_t^(0) = F(E[x_t], m = h_{t-1}^(K)), h_t^(j) = F(h_t^(j-1), m = h_t^(j-1)); the
last one predicts x_{t+1} and is its memory. Vocabulary and thought slots share every projection; gamma
and the gate W_g are separate for thought slots, one set shared by every j (per-j gates would leave an
evaluation beyond the trained K without parameters). A thought slot's x0 is its input state.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from t2mlr_jax.architectures.lrt.thought_slots import LATENT, expand, last_slots, shift, widen
from t2mlr_jax.model.backbone import KVCache, advance, embed, final_norm, init_cache, run_blocks, unembed
from t2mlr_jax.model.block import Feedback, cache_keys, kv_head_gate
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.layers import layer_matrix, weight_init
from t2mlr_jax.model.params import gathered, param_specs
from t2mlr_jax.model.spec import ParamSpec, constant
from t2mlr_jax.model.token_layout import Layout, Output, scan_over_tokens

THOUGHT_SCALARS = ("resid_lambdas", "x0_lambdas")  # backbone scalars of which thought slots have their own


@dataclasses.dataclass(frozen=True)
class LRTConfig:
    """The static description of an LRT (hashable: a static argument of compiled functions)."""

    model: ModelConfig
    feedback: str = "both"
    shared_projections: bool = False
    thought_slots: bool = False  # trained with thought slots: own thought gates, pass 0 unsupervised
    cross_token: bool = True
    embed_scale: float = 1.0  # vocabulary embeddings x this (PonderLM-2's option)
    growing: bool = False  # thought slots filled by K growing passes (PonderLM-2's release; `refine`)

    @property
    def residual(self) -> bool:
        return self.feedback in ("both", "residual")

    @property
    def kv(self) -> bool:
        return self.feedback in ("both", "kv")


def lrt_specs(cfg: LRTConfig) -> dict:
    """The backbone's table plus params["lrt"]: gamma [L], the gate W_g [L, C, 2K] (local, feedback), the
    thought slots' own gamma_thought / gate_thought (and resid / x0 scalars, the spec's "scales separate for
    vocabulary vs thought positions", specified as the backbone's), and the feedback projections
    [L, D, K, E] (or [D, K, E] when shared), initialised like v_proj."""
    model = cfg.model
    d, k, e = model.hidden_size, model.num_kv_heads, model.head_dim
    specs = param_specs(model)
    kinds = ("", "_thought") if cfg.thought_slots else ("",)
    lrt = {}
    if cfg.thought_slots and model.resid_scalars and cfg.feedback != "none":
        for name in THOUGHT_SCALARS:
            lrt[name + "_thought"] = specs[name]
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


def _scalars(p, inputs, resid):
    """The resid / x0 scalars (alpha, beta) of each slot: the thought slots' own where the call has them."""
    if "thought" not in inputs:
        return resid
    thought = inputs["thought"][..., None]
    return tuple(jnp.where(thought, p[name + "_thought"], r) for name, r in zip(THOUGHT_SCALARS, resid))


def _residual(p, inputs, h):
    gamma = _own(p, inputs, "gamma", lambda g: jnp.broadcast_to(g, h.shape[:2]))[..., None]
    return h + gamma.astype(h.dtype) * inputs["m"]


def _gates(p, inputs, x):
    """(g_loc, g_fb), each [B, T, K, 1]."""
    return jnp.split(_own(p, inputs, "gate", lambda w: kv_head_gate(x, w))[..., None], 2, axis=2)


def _kv(p, inputs, x, k, v):
    g_loc, g_fb = _gates(p, inputs, x)
    m = inputs["m"]
    k_fb = jnp.einsum("btd,dke->btke", m, inputs.get("k_fb", p.get("k_fb")).astype(m.dtype))
    v_fb = jnp.einsum("btd,dke->btke", m, inputs.get("v_fb", p.get("v_fb")).astype(m.dtype))
    return g_loc * k + g_fb * k_fb, g_loc * v + g_fb * v_fb


def _capture(p, inputs, x, k, v):
    """What the KV refresh keeps of a block: its feedback gate and its keys before RoPE / QK-norm."""
    return {"g_fb": _gates(p, inputs, x)[1], "k": k}


def feedback(
    cfg: LRTConfig,
    params: dict,
    m: Float[Array, "B T D"],
    thought: Bool[Array, "B T"] | None = None,
    capture: bool = False,
) -> Feedback | None:
    """The memory m hooked into every block: stacked params ride the layer scan, shared ones the inputs;
    `thought` marks the slots that use the thought gates (thought models only); `capture`: each block's
    feedback gate and keys come back (`_capture`)."""
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
        _capture if capture else None,
        _scalars if "resid_lambdas_thought" in lrt else None,
    )


def vocab_inputs(
    cfg: LRTConfig, params: dict, tokens: Int[Array, "B T"], cache: KVCache | None = None
) -> Float[Array, "B T D"]:
    x = embed(cfg.model, params, tokens, cache)
    return x if cfg.embed_scale == 1.0 else (x * cfg.embed_scale).astype(x.dtype)


def _run(
    cfg: LRTConfig,
    params,
    h,
    tokens,
    layout: Layout,
    m,
    thought,
    mlp_state,
    cache=None,
    slots=None,
    capture=False,
):
    """One backbone pass over slots (h their input, also x0) with memory m: (final-normed states, out);
    with a cache, at its next slots or at `slots`."""
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
        feedback=feedback(cfg, params, m, thought, capture),
        tokens=tokens,
        x0=h,
        mlp_state=mlp_state,
        cache_slots=slots,
    )
    return final_norm(model, params, out.h), out


def _reread(cfg: LRTConfig, params: dict) -> dict:
    """What every pass rereads, gathered once per step (`gathered`): the blocks' and the feedback's
    weights."""
    specs = lrt_specs(cfg)
    return gathered(
        cfg.model, params, specs, [name for name in ("layers", "lrt") if name in params and name in specs]
    )


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
    cross-token feedback). Logits are read at each interval's last slot. `cfg.growing` (PonderLM-2's
    release): unsupervised passes over 1, ..., K - 1 thoughts come first, each filling one more thought
    slot (thought j of the next pass takes slot j - 1's state), so that thought j starts from j passes.
    """
    model = cfg.model
    growing = list(range(1, thoughts)) if cfg.growing else []
    if growing or refinements:
        params = _reread(cfg, params)
    x = vocab_inputs(cfg, params, tokens)
    states, out = _run(cfg, params, x, tokens, layout, jnp.zeros_like(x), None, mlp_state)
    stats = out.stats
    logits = [] if cfg.thought_slots else [unembed(model, params, states)]
    for k in growing + [thoughts] * refinements:
        slots = expand(tokens, layout, k)
        thought = slots.thought[..., None]
        previous = shift(widen(states, tokens.shape[1], k), slots.starts)
        m = previous if cfg.cross_token else jnp.where(thought, previous, 0.0).astype(previous.dtype)
        h = jnp.where(thought, previous, jnp.repeat(x, k + 1, axis=1))
        states, out = _run(cfg, params, h, slots.tokens, slots.layout, m, slots.thought, mlp_state)
        stats = jax.tree.map(jnp.add, stats, out.stats)
        if k == thoughts:
            logits.append(unembed(model, params, last_slots(states, thoughts)))
    return Passes(tuple(logits), stats)


def interleaved(
    cfg: LRTConfig,
    params: dict,
    tokens: Int[Array, "B T"],
    layout: Layout,
    passes: int,
    mlp_state=None,
    kv_refresh: bool = False,
) -> Passes:
    """The LRT release's parallel interleaved training (nanochat/gpt.py's forward_interleaved_train in
    OoDBag/Latent_recurrent_transformer): pass 0 runs every slot with zero memory and fills a KV buffer;
    then interleaved pass i = 0..N-1 (N = `passes`, static) reruns only the slots t % N == i, with the
    memory m = the running final states shifted one token, its queries attending to the buffer in which
    its fresh keys / values have replaced the earlier ones (kept there for the passes after it), and its
    final states merged into the running ones. Gradients flow through the buffer and the memory.
    `kv_refresh` (the release's interleaved_kv_refresh): after pass 0 and each interleaved pass but the
    last, the slots no interleaved pass has rerun yet get `_refresh`ed keys and values.
    Returns the logits of pass 0, then the interleaved passes' merged (slot t's from pass t % N)."""
    model = cfg.model
    b, t = tokens.shape
    params = _reread(cfg, params)
    x = vocab_inputs(cfg, params, tokens)
    buffer = init_cache(model, b, t)
    m = jnp.zeros_like(x)
    states, out = _run(cfg, params, x, tokens, layout, m, None, mlp_state, buffer, capture=kv_refresh)
    first, stats, starts = unembed(model, params, states), out.stats, layout.positions == 0
    pass_0, buffer = out, out.cache
    for i in range(passes):
        if kv_refresh:  # before pass i: the slots of passes i.. are stale
            stale = jnp.arange(t) % passes >= i
            buffer = _refresh(cfg, params, buffer, pass_0, shift(states, starts), stale, layout.positions)
        slots = jnp.arange(i, t, passes)  # static: each pass compiles to its own fixed shapes
        m = shift(states, starts)[:, slots]
        at = Layout(*(a[:, slots] for a in layout))
        fresh, out = _run(cfg, params, x[:, slots], tokens[:, slots], at, m, None, mlp_state, buffer, slots)
        states, buffer = states.at[:, slots].set(fresh), out.cache
        stats = jax.tree.map(jnp.add, stats, out.stats)
    return Passes((first, unembed(model, params, states)), stats)


def _refresh(cfg: LRTConfig, params: dict, buffer: KVCache, pass_0, m, stale, positions) -> KVCache:
    """The release's cheap KV refresh: at the `stale` slots, pass 0's keys and values with their feedback
    terms recomputed from the memory m, all else of pass 0 kept (its own memory was zero):
    v = v_0 + g_fb W_v^fb m, k = RoPE / QK-norm of (k_0 + g_fb W_k^fb m), with pass 0's gate g_fb and
    keys k_0 before RoPE (pass_0.captured)."""
    lrt, g_fb = params["lrt"], pass_0.captured["g_fb"]  # [L, B, T, K, 1]
    project = lambda w: jnp.einsum("btd,...dke->...btke", m, w.astype(m.dtype))  # per layer or shared
    k = cache_keys(cfg.model, params, pass_0.captured["k"] + g_fb * project(lrt["k_fb"]), positions)
    v = pass_0.cache.v + g_fb * project(lrt["v_fb"])
    keep = stale[:, None, None]
    return buffer._replace(k=jnp.where(keep, k, buffer.k), v=jnp.where(keep, v, buffer.v))


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

    hn, cache = slot(
        vocab_inputs(cfg, params, tokens, cache), tokens, m, jnp.zeros(tokens.shape, bool), cache
    )
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
