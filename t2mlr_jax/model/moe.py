"""Mixture-of-experts MLP ("moe" in the MLP registry `t2mlr_jax.model.layers.MLPS`).

Per token: sigmoid router scores s = sigmoid(x W_router) (fp32); the token's top `moe_top_k` experts by
s + b, where b is a per-expert routing bias (non-gradient state; it steers selection only); combine
weights are the selected s normalised to sum 1 (DeepSeek-V3). Each expert is nanochat's relu² MLP:
y = shared(x) + sum_k w_k expert_k(x). The `moe_shared` always-on experts are one relu² MLP of width
moe_shared * expert_dim (exactly the sum of that many relu² experts: relu² acts per hidden unit).

Dispatch is by sorting, never by running every expert on every token: the N = B*T tokens' N*k
assignments are stably sorted by expert, each gets its rank within its expert, and the first
C = ceil(capacity_factor * N * k / X) of each expert (tokens first in the call's row-major [B, T] order
first, so row 0's before row 1's; C = N, dropless, when the capacity factor is None) are gathered into an
[X, C, D] buffer that the experts run on with one einsum over their stacked weights. Assignments beyond C
are dropped (they add nothing; the shared expert still applies). The buffer is constrained to ("moe_groups",
"experts", None, "act_embed"), so on a mesh with expert > 1 each device runs only its experts (expert
parallelism).
Capacity is counted over the whole call (`moe_capacity_groups="call"`, the LRT release's), so which
tokens drop depends on the batch (pass moe_capacity_factor=None for batch-independent outputs); "row"
counts it per row of T tokens (MaxText's dropping MoE), so each row's [X, C, D] buffer is its own and the
buffers shard with the batch (`moe_groups` in the rule table) instead of every device holding the call's.

Where dropping differs between paths that are otherwise equal: C is per call, over the N tokens routed
together. A parallel pass (training: the LRT's refinement passes, T²MLR's Jacobi passes, any parallel
teacher-forced forward) routes a call's B*T tokens together; the token-by-token paths (the exact
recurrences, cached decoding) route the B tokens of one step. With a capacity factor set they drop
different assignments (one row, B = 1, never: C >= 1 and a token picks an expert at most once), so "P >=
T - 1 refinements == the exact recurrence" and "Jacobi with D >= T == exact" hold only dropless; that is
why the LRT and the looped models evaluate and decode with moe_capacity_factor=None. Where the same tokens
are routed together (a re-run of a batch, per-layer weights against the stack, sharded against one device,
decoding against the exact recurrence) the same assignments drop (tests/architectures/test_moe_capacity.py).

Balancing is auxiliary-loss-free (DeepSeek-V3): after each optimizer step the bias moves by
moe_bias_rate * sign(mean load - load) per layer, from the per-expert loads the step reported.

Letters: G capacity groups (1, or B by row), N tokens per group, X experts, K picks per token (top_k), C
capacity, D model, F expert width.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.layers import layer_matrix, register_mlp, relu2
from t2mlr_jax.parallel.rules import constrain

EXPERT_BUFFER_AXES = ("moe_groups", "experts", None, "act_embed")  # the dispatched tokens [G, X, C, D]


def moe_specs(cfg: ModelConfig) -> dict:
    """params["layers"]["mlp"]: the router [L, D, X], the routed experts' relu² weights [L, X, D, F] /
    [L, X, F, D] and (moe_shared > 0) the shared experts as one relu² MLP of width moe_shared * F."""
    d, f, x = cfg.hidden_size, cfg.expert_dim, cfg.moe_experts
    specs = {
        "router": layer_matrix(cfg, (d, x), ("embed", None)),
        "up_proj": layer_matrix(cfg, (x, d, f), ("experts", "embed", "mlp")),
        "down_proj": layer_matrix(cfg, (x, f, d), ("experts", "mlp", "embed"), role="out"),
    }
    if cfg.moe_shared:
        s = cfg.moe_shared * f
        specs["shared"] = {
            "up_proj": layer_matrix(cfg, (d, s), ("embed", "mlp")),
            "down_proj": layer_matrix(cfg, (s, d), ("mlp", "embed"), role="out"),
        }
    return specs


def capacity(cfg: ModelConfig, num_tokens: int) -> int:
    """Slots per expert for a call of `num_tokens` tokens: ceil(factor * N * k / X) in [1, N]; N (no drop
    is possible, each token picks an expert at most once) when the factor is None."""
    if cfg.moe_capacity_factor is None:
        return num_tokens
    c = math.ceil(cfg.moe_capacity_factor * num_tokens * cfg.moe_top_k / cfg.moe_experts)
    return max(1, min(c, num_tokens))


def route(
    cfg: ModelConfig, x: Float[Array, "N D"], router: Float[Array, "D X"], bias: Float[Array, " X"]
) -> tuple[Int[Array, "N K"], Float[Array, "N K"]]:
    """Each token's top_k distinct experts by sigmoid score + bias, and their combine weights: the
    selected scores (without the bias) normalised to sum 1. fp32 (or x's dtype where wider: the tests'
    float64 evaluations); no gradient reaches the selection."""
    acc = jnp.promote_types(x.dtype, jnp.float32)
    scores = jax.nn.sigmoid(jnp.einsum("nd,dx->nx", x.astype(acc), router.astype(acc)))
    choice = jax.lax.stop_gradient(scores) + jax.lax.stop_gradient(bias.astype(acc))
    _, experts = jax.lax.top_k(choice, cfg.moe_top_k)
    picked = jnp.take_along_axis(scores, experts, axis=-1)
    return experts, picked / jnp.sum(picked, axis=-1, keepdims=True)


def _slots(
    cfg: ModelConfig, c: int, experts: Int[Array, "N K"], weights: Float[Array, "N K"]
) -> tuple[Int[Array, "X C"], Float[Array, "X C"], Int[Array, " X"]]:
    """One group's dispatch: which token fills each of the X x C slots (N: empty, the pad row), its combine
    weight, and each expert's load before dropping."""
    n, k, num_experts = experts.shape[0], cfg.moe_top_k, cfg.moe_experts
    # Sort the N*k assignments (a = token * k + pick) by expert, stably: earlier tokens keep their slots.
    flat = experts.reshape(n * k)
    order = jnp.argsort(flat, stable=True)
    load = jnp.zeros((num_experts,), jnp.int32).at[flat].add(1)
    starts = jnp.cumsum(load) - load
    # Slot (e, r) holds the assignment of sorted position starts[e] + r, when r < min(load[e], C).
    rank = jnp.arange(c, dtype=jnp.int32)
    filled = rank[None, :] < load[:, None]  # [X, C]
    assignment = order[jnp.minimum(starts[:, None] + rank[None, :], n * k - 1)]  # [X, C]
    token = jnp.where(filled, assignment // k, n)  # n: an empty slot (reads / writes the pad row)
    slot_weight = jnp.where(filled, weights.reshape(n * k)[assignment], 0.0)  # [X, C] fp32
    return token, slot_weight, load


def moe_apply(
    cfg: ModelConfig, p: dict, x: Float[Array, "B T D"], state: dict | None
) -> tuple[Float[Array, "B T D"], dict]:
    """One layer's MoE on the normed stream. Stats (sums over the call's tokens): "load" [X], the
    assignments routed to each expert before capacity dropping, and "dropped", those dropped."""
    b, t, d = x.shape
    groups, n = (b, t) if cfg.moe_capacity_groups == "row" else (1, b * t)
    num_experts, c = cfg.moe_experts, capacity(cfg, n)
    bias = jnp.zeros((num_experts,), jnp.float32) if state is None else state["router_bias"]
    experts, weights = route(cfg, x.reshape(b * t, d), p["router"], bias)
    shaped = (groups, n, cfg.moe_top_k)
    token, slot_weight, load = jax.vmap(lambda e, w: _slots(cfg, c, e, w))(
        experts.reshape(shaped), weights.reshape(shaped)
    )  # [G, X, C], [G, X, C], [G, X]

    xg = x.reshape(groups, n, d)
    padded = jnp.concatenate([xg, jnp.zeros((groups, 1, d), x.dtype)], axis=1)
    buf = constrain(jax.vmap(lambda rows, slots: rows[slots])(padded, token), EXPERT_BUFFER_AXES)
    hidden = jnp.square(jax.nn.relu(jnp.einsum("gxcd,xdf->gxcf", buf, p["up_proj"])))
    out = constrain(jnp.einsum("gxcf,xfd->gxcd", hidden, p["down_proj"]), EXPERT_BUFFER_AXES)
    acc = jnp.promote_types(x.dtype, jnp.float32)  # the combine's sums: fp32, or wider with x
    weighted = (out.astype(acc) * slot_weight[..., None]).reshape(groups, num_experts * c, d)

    def combine(slots: Int[Array, "X C"], values: Float[Array, "XC D"]) -> Float[Array, "N D"]:
        return jnp.zeros((n + 1, d), acc).at[slots.reshape(-1)].add(values)[:n]

    y = jax.vmap(combine)(token, weighted).astype(x.dtype).reshape(b, t, d)
    if "shared" in p:
        y = y + relu2(x, p["shared"]["up_proj"], p["shared"]["down_proj"])
    stats = {
        "load": jnp.sum(load, axis=0).astype(jnp.float32),
        "dropped": jnp.sum(jnp.maximum(load - c, 0)).astype(jnp.float32),
    }
    return y, stats


def moe_init_state(cfg: ModelConfig) -> dict:
    """The routing biases, one per expert and layer, fp32 zeros."""
    return {"router_bias": jnp.zeros((cfg.num_layers, cfg.moe_experts), jnp.float32)}


def moe_update_state(cfg: ModelConfig, state: dict, stats: dict) -> tuple[dict, dict]:
    """Auxiliary-loss-free balancing from the step's stats (stacked on layers, summed over micro-batches):
    bias += moe_bias_rate * sign(mean load - load) per layer. Metrics: "moe/imbalance" (max load / mean
    load, averaged over layers; 1 is perfectly balanced), "moe/dropped_fraction" (dropped / routed
    assignments) and "moe/load/e{i}" (expert i's share of the assignments, averaged over layers)."""
    load = stats["load"].astype(jnp.float32)  # [L, X]
    mean = jnp.mean(load, axis=-1, keepdims=True)
    bias = state["router_bias"] + cfg.moe_bias_rate * jnp.sign(mean - load)
    routed = jnp.sum(load, axis=-1)  # [L]
    share = load / jnp.maximum(routed, 1.0)[:, None]
    imbalance = jnp.where(mean[:, 0] > 0, jnp.max(load, axis=-1) / jnp.maximum(mean[:, 0], 1e-9), 1.0)
    metrics = {
        "moe/imbalance": jnp.mean(imbalance),
        "moe/dropped_fraction": jnp.sum(stats["dropped"]) / jnp.maximum(jnp.sum(routed), 1.0),
        **{f"moe/load/e{i}": v for i, v in enumerate(jnp.mean(share, axis=0))},
    }
    return {**state, "router_bias": bias.astype(state["router_bias"].dtype)}, metrics


register_mlp("moe", moe_specs, moe_apply, init_state=moe_init_state, update_state=moe_update_state)
