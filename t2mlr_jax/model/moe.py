"""Mixture-of-experts MLP ("moe" in the MLP registry `t2mlr_jax.model.layers.MLPS`).

Per token: sigmoid router scores s = sigmoid(x W_router) (fp32); the token's top `moe_top_k` experts by
s + b, where b is a per-expert routing bias (non-gradient state; it steers selection only); combine
weights are the selected s normalised to sum 1 (DeepSeek-V3). Each expert is nanochat's relu² MLP:
y = shared(x) + sum_k w_k expert_k(x). The `moe_shared` always-on experts are one relu² MLP of width
moe_shared * expert_dim (exactly the sum of that many relu² experts: relu² acts per hidden unit).

Dispatch is by sorting, never by running every expert on every token. Which way (`dispatch_path`): with a
moe_capacity_factor, the capacity buffer; dropless (None), grouped matmuls on an accelerator and the buffer
with C = N (nothing drops) on CPU, by the platform the program is compiled for (`target_platform`).

Grouped (megablox / MaxText's dropless MoE): the N = B*T tokens' N*K assignments are stably sorted by
expert, x gathered into that order [N*K, D], and each projection is one grouped matmul over the X experts'
stacked weights with the experts' loads as group sizes: N*K rows, the MoE's own FLOPs. On TPU megablox's
Pallas `gmm` (its VJP: `gmm` for the input gradient, `tgmm` for the weights'), as MaxText; libtpu compiles
`ragged_dot`'s weight gradient densely (a convolution over X masked copies of the rows: X times the work).
On GPU `jax.lax.ragged_dot`, and on TPU where gmm's tiles do not fit (`_grouped_matmul`). On a mesh each
device runs its tokens (the batch axes) through its X/E experts in a `shard_map`: it gathers its
expert-axis peers' tokens, runs the assignments to its experts, and sums its partial outputs back onto the
peers' tokens (psum_scatter over `expert`; tensor splits F and sums over `tensor`); the experts' weights
arrive whole in D (fsdp gathers them first).

With a capacity factor: a buffer. Each expert keeps the first C = ceil(capacity_factor * N * K / X) of its
assignments (tokens in row-major [B, T] order, so row 0's before row 1's), gathered into a [G, X, C, D]
buffer that the experts run on with one einsum over their stacked weights; assignments beyond C are
dropped (they add nothing; the shared expert still applies). The buffer is constrained to ("moe_groups",
"experts", None, "act_embed"), so on a mesh with expert > 1 each device runs only its experts.
Capacity is counted over the whole call (`moe_capacity_groups="call"`: G = 1), so which
tokens drop depends on the batch (pass moe_capacity_factor=None for batch-independent outputs); "row"
counts it per row of T tokens (MaxText's dropping MoE: G = B, N = T), so each row's [X, C, D] buffer is
its own and the buffers shard with the batch (`moe_groups` in the rule table) instead of every device
holding the call's.

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

Letters: G capacity groups (1, or B by row), N tokens per group, X experts (a function's own: X/E per
device of a mesh's expert axis of E), K picks per token (top_k), C capacity, D model, F expert width.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.layers import layer_matrix, register_mlp, relu2
from t2mlr_jax.parallel.mesh import target_platform
from t2mlr_jax.parallel.rules import RESIDUAL_AXES, constrain, partition_spec

EXPERT_BUFFER_AXES = ("moe_groups", "experts", None, "act_embed")  # the dispatched tokens [G, X, C, D]
# Dropless dispatch by platform; any other (CPU) runs the buffer with C = N: XLA:CPU expands ragged_dot
# densely, every expert on each of the N*K rows, K times the buffer's X*N (X=8, K=2, 2048 tokens: 0.57 s
# against the buffer's 0.29 s).
GROUPED_KERNELS = {"tpu": "gmm", "gpu": "ragged_dot"}
GMM_TILE = 128  # megablox's default tiling, (128, 128, 128) in (rows, k, n)


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


def dispatch_path(cfg: ModelConfig) -> str:
    """How `moe_apply` dispatches: "buffer" with a capacity factor; dropless, the grouped matmul of the
    platform the program is compiled for (`GROUPED_KERNELS`; a TPU compiled for ahead of time from a CPU
    gets its gmm), else the buffer with C = N."""
    if cfg.moe_capacity_factor is not None:
        return "buffer"
    return GROUPED_KERNELS.get(target_platform(), "buffer")


def _gmm_fits(x: Float[Array, "R I"], w: Float[Array, "X I O"]) -> bool:
    """Whether megablox's gmm takes this product: bf16 / fp32 operands (not the tests' float64)."""
    return {x.dtype, w.dtype} <= {jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32)}


def _grouped_matmul(
    x: Float[Array, "R I"],
    w: Float[Array, "X I O"],
    group_sizes: Int[Array, " X"],
    kernel: str,
    interpret: bool = False,
) -> Float[Array, "R O"]:
    """Group e's rows of x (group_sizes[e] of them, after the groups before it) times w[e]; rows past the
    groups come out zero and pass no gradient. `kernel` "gmm": megablox's where it fits (`_gmm_fits`; else
    ragged_dot), `interpret` running it on a CPU; "ragged_dot": `jax.lax.ragged_dot`."""
    if kernel != "gmm" or not _gmm_fits(x, w):
        return jax.lax.ragged_dot(x, w, group_sizes)
    from jax.experimental.pallas.ops.tpu import megablox  # Mosaic kernels: imported where a TPU runs them

    (m, i), o = x.shape, w.shape[2]
    # gmm takes whole tiles: rows, I and O padded with zeros (exact: a zero column adds nothing, a zero
    # output column is sliced off), e.g. nanochat's expert width 4D/3 (1365 at d16) to 1408.
    pad = lambda n: -n % GMM_TILE
    rows = jnp.pad(x, ((0, pad(m)), (0, pad(i))))
    w = jnp.pad(w, ((0, 0), (0, pad(i)), (0, pad(o))))
    # The rows past the groups (the pad, other devices' experts' assignments) as one more group, with no
    # weight: gmm then writes them zero (its path for a shard of the experts) instead of leaving them
    # unwritten, and tgmm leaves them out of the weight gradient.
    sizes = group_sizes.astype(jnp.int32)
    sizes = jnp.append(sizes, rows.shape[0] - jnp.sum(sizes))
    out_dtype = jnp.promote_types(x.dtype, w.dtype)  # as ragged_dot's
    out = megablox.gmm(rows, w, sizes, out_dtype, (GMM_TILE,) * 3, interpret=interpret)
    return out[:m, :o]


def _grouped(
    x: Float[Array, "B T D"],
    experts: Int[Array, "B T K"],
    weights: Float[Array, "B T K"],
    up_proj: Float[Array, "X D F"],
    down_proj: Float[Array, "X F D"],
    kernel: str,
    first: Int[Array, ""] | int = 0,
) -> Float[Array, "B T D"]:
    """The tokens' assignments to experts first .. first + X - 1 (those `up_proj` / `down_proj` hold),
    sorted by expert and run with one grouped matmul per projection (`_grouped_matmul`'s `kernel`); each
    token's weighted sum of its outputs (fp32, or wider with x). Assignments to other experts add nothing."""
    b, t, d = x.shape
    n, k, num_experts = b * t, experts.shape[-1], up_proj.shape[0]
    local = experts.reshape(n * k) - first
    local = jnp.where((local >= 0) & (local < num_experts), local, num_experts)  # others' experts: last
    order = jnp.argsort(local, stable=True)
    sizes = jnp.bincount(local, length=num_experts + 1)[:num_experts]
    # Rows past this call's assignments get token n, out of bounds: gathered as zeros and dropped by the
    # combine, so neither they nor their gradients reach a token.
    token = jnp.where(jnp.arange(n * k) < jnp.sum(sizes), order // k, n)
    rows = x.reshape(n, d).at[token].get(mode="fill", fill_value=0)
    hidden = jnp.square(jax.nn.relu(_grouped_matmul(rows, up_proj, sizes, kernel)))
    out = _grouped_matmul(hidden, down_proj, sizes, kernel)
    acc = jnp.promote_types(x.dtype, jnp.float32)  # the combine's sums: fp32, or wider with x
    weighted = out.astype(acc) * weights.reshape(n * k)[order][:, None]
    return jnp.zeros((n, d), acc).at[token].add(weighted, mode="drop").reshape(b, t, d)


def _grouped_dispatch(
    x: Float[Array, "B T D"],
    experts: Int[Array, "B T K"],
    weights: Float[Array, "B T K"],
    up_proj: Float[Array, "X D F"],
    down_proj: Float[Array, "X F D"],
    kernel: str,
) -> Float[Array, "B T D"]:
    """`_grouped` on all the experts; under a mesh, in a shard_map, each device its tokens through its
    experts: partitioned by XLA instead, the sort would run over the whole batch on every device (and gmm,
    a custom call, cannot be partitioned)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return _grouped(x, experts, weights, up_proj, down_proj, kernel)
    rows = partition_spec(RESIDUAL_AXES, x.shape, mesh)  # the batch axes that divide B
    up_spec = partition_spec(("experts", None, "mlp"), up_proj.shape, mesh)  # whole in D: fsdp gathers
    down_spec = partition_spec(("experts", "mlp", None), down_proj.shape, mesh)
    split = up_spec[0] is not None  # X/E experts per device
    gather = split and "expert" in jax.tree.leaves(rows[0])  # the expert peers' tokens differ
    # Partial outputs: over experts when the peers share their tokens, over F's shards when tensor splits it.
    summed = (("expert",) if split and not gather else ()) + (("tensor",) if up_spec[2] else ())

    def local(x, experts, weights, up_proj, down_proj):
        if gather:
            x, experts, weights = (jax.lax.all_gather(a, "expert", tiled=True) for a in (x, experts, weights))
        first = jax.lax.axis_index("expert") * up_proj.shape[0] if split else 0
        y = _grouped(x, experts, weights, up_proj, down_proj, kernel, first)
        y = jax.lax.psum(y, summed) if summed else y
        return jax.lax.psum_scatter(y, "expert", scatter_dimension=0, tiled=True) if gather else y

    # check_vma off: argsort of a device-varying array is typed invariant (jax 0.10.2), and the gradient
    # through the gather by that order then comes back from one device instead of summed over the peers.
    specs = (rows, rows, rows, up_spec, down_spec)
    sharded = jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=rows, check_vma=False)
    return sharded(x, experts, weights, up_proj, down_proj)


def _buffer_dispatch(
    cfg: ModelConfig,
    x: Float[Array, "B T D"],
    experts: Int[Array, "B T K"],
    weights: Float[Array, "B T K"],
    up_proj: Float[Array, "X D F"],
    down_proj: Float[Array, "X F D"],
) -> tuple[Float[Array, "B T D"], Int[Array, " X"], Int[Array, ""]]:
    """The routed experts' combined output (fp32, or wider with x) through the capacity buffer, the
    per-expert load before dropping and the number of assignments dropped."""
    b, t, d = x.shape
    groups, n = (b, t) if cfg.moe_capacity_groups == "row" else (1, b * t)
    num_experts, c = cfg.moe_experts, capacity(cfg, n)
    shaped = (groups, n, cfg.moe_top_k)
    token, slot_weight, load = jax.vmap(lambda e, w: _slots(cfg, c, e, w))(
        experts.reshape(shaped), weights.reshape(shaped)
    )  # [G, X, C], [G, X, C], [G, X]

    xg = x.reshape(groups, n, d)
    padded = jnp.concatenate([xg, jnp.zeros((groups, 1, d), x.dtype)], axis=1)
    buf = constrain(jax.vmap(lambda rows, slots: rows[slots])(padded, token), EXPERT_BUFFER_AXES)
    hidden = jnp.square(jax.nn.relu(jnp.einsum("gxcd,xdf->gxcf", buf, up_proj)))
    out = constrain(jnp.einsum("gxcf,xfd->gxcd", hidden, down_proj), EXPERT_BUFFER_AXES)
    acc = jnp.promote_types(x.dtype, jnp.float32)  # the combine's sums: fp32, or wider with x
    weighted = (out.astype(acc) * slot_weight[..., None]).reshape(groups, num_experts * c, d)

    def combine(slots: Int[Array, "X C"], values: Float[Array, "XC D"]) -> Float[Array, "N D"]:
        return jnp.zeros((n + 1, d), acc).at[slots.reshape(-1)].add(values)[:n]

    y = jax.vmap(combine)(token, weighted).reshape(b, t, d)
    return y, jnp.sum(load, axis=0), jnp.sum(jnp.maximum(load - c, 0))


def moe_apply(
    cfg: ModelConfig, p: dict, x: Float[Array, "B T D"], state: dict | None
) -> tuple[Float[Array, "B T D"], dict]:
    """One layer's MoE on the normed stream. Stats (sums over the call's tokens): "load" [X], the
    assignments routed to each expert before capacity dropping, and "dropped", those dropped."""
    b, t, d = x.shape
    bias = jnp.zeros((cfg.moe_experts,), jnp.float32) if state is None else state["router_bias"]
    experts, weights = route(cfg, x.reshape(b * t, d), p["router"], bias)
    experts, weights = experts.reshape(b, t, -1), weights.reshape(b, t, -1)
    path = dispatch_path(cfg)
    if path == "buffer":
        y, load, dropped = _buffer_dispatch(cfg, x, experts, weights, p["up_proj"], p["down_proj"])
    else:
        y = _grouped_dispatch(x, experts, weights, p["up_proj"], p["down_proj"], path)
        load, dropped = jnp.bincount(experts.reshape(-1), length=cfg.moe_experts), jnp.zeros(())
    y = y.astype(x.dtype)
    if "shared" in p:
        y = y + relu2(x, p["shared"]["up_proj"], p["shared"]["down_proj"])
    return y, {"load": load.astype(jnp.float32), "dropped": dropped.astype(jnp.float32)}


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
