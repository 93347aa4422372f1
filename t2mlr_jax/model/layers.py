"""Transformer building blocks as pure functions: RMSNorm, RoPE (HF rotate-half layout), GQA attention
(optional logit softcap; the einsum reference or XLA / cuDNN / TPU splash kernels), and the MLP registry
(`MLPS`: SwiGLU, GeGLU, ReLU²; more register by name).

Dimension letters (shared with the einsum strings and the sharding rules):
B batch, T query time, S key time, D model, H query heads, K kv heads, G = H/K heads per kv head,
E head dim, F mlp hidden, V vocab, L layers.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from einops import rearrange
from jax.ad_checkpoint import checkpoint_name
from jaxtyping import Array, Bool, Float, Int

from t2mlr_jax.model import splash
from t2mlr_jax.model.config import ATTENTION_IMPLS, MLP_NAMES, ModelConfig
from t2mlr_jax.model.spec import ParamSpec, normal, uniform, zeros
from t2mlr_jax.parallel.mesh import target_platform

NEG_INF = -1e30  # finite so a fully masked row (padding) averages instead of producing NaN


def _sum_last(x: Float[Array, "*N D"]) -> Float[Array, "*N"]:
    """x summed over its last axis; compiled for a CPU, as a product with ones, which XLA:CPU runs 2-6x
    faster than a reduce of a fused product (the backward reductions of RMSNorm and softmax at 135M:
    docs/performance.md). Other platforms get the plain reduce."""
    if target_platform() != "cpu":
        return jnp.sum(x, axis=-1)
    return jnp.matmul(x, jnp.ones(x.shape[-1], x.dtype), precision=jax.lax.Precision.HIGHEST)


def _sum_leading(x: Float[Array, "*N D"]) -> Float[Array, " D"]:
    """x summed over every axis but its last (the same trade as `_sum_last`)."""
    return _sum_last(x.reshape(-1, x.shape[-1]).T)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _rms_scaled(x: Float[Array, "*N D"], scale: Float[Array, " D"], eps: float) -> Float[Array, "*N D"]:
    return _rms_scaled_fwd(x, scale, eps)[0]


def _rms_scaled_fwd(x, scale, eps):
    r = jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)
    return x * r * scale, (x, r, scale)


def _rms_scaled_bwd(eps, res, g):
    x, r, scale = res
    x_hat, g_scaled = x * r, g * scale
    dx = r * (g_scaled - x_hat * (_sum_last(g_scaled * x_hat) / x.shape[-1])[..., None])
    return dx, _sum_leading(g * x_hat)


_rms_scaled.defvjp(_rms_scaled_fwd, _rms_scaled_bwd)


def rms_norm(
    x: Float[Array, "*B D"], weight: Float[Array, " D"] | None, eps: float, offset: bool = False
) -> Float[Array, "*B D"]:
    """RMSNorm computed in fp32, cast back to the input dtype (HF Llama semantics); `offset` scales by
    (1 + weight) instead (HF Gemma's weights, stored as offsets from 1). Its gradient is written out
    (a custom VJP, reverse mode only) so that its two reductions take `_sum_last`'s fast form."""
    if weight is None:
        scale = jnp.ones(x.shape[-1], jnp.float32)
    else:
        scale = 1.0 + weight.astype(jnp.float32) if offset else weight.astype(jnp.float32)
    return _rms_scaled(x.astype(jnp.float32), scale, eps).astype(x.dtype)


@jax.custom_vjp
def softmax(x: Float[Array, "*N S"]) -> Float[Array, "*N S"]:
    """jax.nn.softmax over the last axis, its gradient's row sums in `_sum_last`'s fast form (a custom
    VJP, reverse mode only)."""
    return jax.nn.softmax(x, axis=-1)


def _softmax_fwd(x):
    p = jax.nn.softmax(x, axis=-1)
    return p, p


def _softmax_bwd(p, g):
    gp = g * p
    return (gp - p * _sum_last(gp)[..., None],)


softmax.defvjp(_softmax_fwd, _softmax_bwd)


def rope(
    x: Float[Array, "B T N E"],
    positions: Int[Array, "B T"],
    theta: float | Float[Array, ""] | None,
    table_dtype: str = "float32",
) -> Float[Array, "B T N E"]:
    """Rotary embedding in HF's rotate-half layout: pairs are (i, i + E/2). theta=None is NoPE; theta may
    be a traced scalar (a per-layer base scanned with the blocks). The cos / sin tables are rounded to
    `table_dtype` (nanochat's are bfloat16), the rotation computed in float32."""
    if theta is None:
        return x
    half = x.shape[-1] // 2
    inv_freq = 1.0 / (theta ** (jnp.arange(half, dtype=jnp.float32) / half))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # B T E/2
    table = lambda a: a.astype(table_dtype).astype(jnp.float32)[:, :, None, :]
    cos, sin = table(jnp.cos(angles)), table(jnp.sin(angles))
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


def attention_mask(
    q_segments: Int[Array, "B T"],
    k_segments: Int[Array, "B S"],
    q_slots: Int[Array, "B T"],
    k_slots: Int[Array, "B S"],
) -> Bool[Array, "B T S"]:
    """Causal within a document: same non-zero segment id and key slot <= query slot."""
    same_doc = (q_segments[:, :, None] == k_segments[:, None, :]) & (k_segments[:, None, :] != 0)
    return same_doc & (k_slots[:, None, :] <= q_slots[:, :, None])


@functools.partial(
    jax.tree_util.register_dataclass, data_fields=("segment_ids", "window"), meta_fields=("windows",)
)
@dataclasses.dataclass(frozen=True)
class DocumentMask:
    """The backbone's own mask over a call's slots: causal within a document (`segment_ids`, 0 = padding,
    which sees no key), within a sliding `window` when one is set (a query sees keys at most `window` slots
    back). A structure, not a [B, T, T] array, so TPU splash builds its block mask at trace time (no mask
    tensor; blocks nobody sees skipped when compiling) and takes the documents as segment ids; the other
    paths take it `dense`. `window` may be traced (a layer's, scanned with the stack); `windows` is every
    value it can take."""

    segment_ids: Int[Array, "B T"]
    window: Int[Array, ""] | None = None
    windows: tuple[int, ...] = ()

    def dense(self) -> Bool[Array, "B T T"]:
        slots = jnp.broadcast_to(jnp.arange(self.segment_ids.shape[1]), self.segment_ids.shape)
        mask = attention_mask(self.segment_ids, self.segment_ids, slots, slots)
        if self.window is None:
            return mask
        return mask & (slots[:, :, None] - slots[:, None, :] <= self.window)


def softcap(x: Float[Array, "*B"], cap: float) -> Float[Array, "*B"]:
    """cap * tanh(x / cap): a smooth bound |x| < cap (Gemma 2 / nanochat logit softcap)."""
    return cap * jnp.tanh(x / cap)


# "auto"'s choice per platform. CPU keeps the reference einsum: XLA's dot_product_attention is no faster
# there for a training step and a little slower decoding (tests/model/test_attention_paths.py's docstring).
AUTO_ATTENTION = {"gpu": "cudnn", "tpu": "pallas"}
CPU_ATTENTION = "einsum"
_NEEDS_BACKEND = {"cudnn": "gpu", "pallas": "tpu"}


def attention_path(
    impl: str, q: Float[Array, "B T H E"], k: Float[Array, "B S K E"], logit_cap: float | None
) -> str:
    """The implementation one `attend` call runs: `impl` (ModelConfig.attention_impl) narrowed by the call's
    static facts and the platform it is compiled for (`target_platform`: the mesh's devices, so that a
    program compiled ahead of time for a TPU gets the TPU's kernel). A fused kernel that cannot take these
    inputs falls back to xla, and xla (no softcap) to einsum; a kernel named for another platform is a
    ValueError."""
    if impl not in ATTENTION_IMPLS:
        raise ValueError(f"attention_impl must be one of {ATTENTION_IMPLS}, got {impl!r}")
    backend = target_platform()
    if _NEEDS_BACKEND.get(impl, backend) != backend:
        raise ValueError(f"attention_impl={impl!r} needs a {_NEEDS_BACKEND[impl]} backend, not {backend}")
    if impl == "auto":
        impl = AUTO_ATTENTION.get(backend, CPU_ATTENTION)
    t, e, s = q.shape[1], q.shape[-1], k.shape[1]
    # cuDNN's flash attention: half precision, head_dim <= 128 in multiples of 8, even lengths with a bias.
    half = q.dtype in (jnp.bfloat16, jnp.float16)
    fits_cudnn = half and logit_cap is None and e <= 128 and e % 8 == 0 and t % 2 == s % 2 == 0
    if impl == "cudnn" and not fits_cudnn:
        impl = "xla"
    if impl == "pallas" and (t % 128 or s % 128):  # splash's default 128 x 128 blocks must tile the mask
        impl = "xla"
    if impl == "xla" and logit_cap is not None:
        impl = "einsum"
    return impl


def attend(
    q: Float[Array, "B T H E"],
    k: Float[Array, "B S K E"],
    v: Float[Array, "B S K E"],
    mask: Bool[Array, "B T S"] | DocumentMask,
    logit_cap: float | None = None,
    scale_dim: float | None = None,
    impl: str = "einsum",
) -> Float[Array, "B T H E"]:
    """Grouped-query softmax attention; logits (scaled by scale_dim**-0.5, head_dim when None, and
    softcapped when `logit_cap` is set) and softmax in fp32. `impl` picks the kernel (`attention_path`);
    every path computes the same function, a query that sees no key (padding) included: it averages all
    values, as the reference's softmax over all-NEG_INF logits does. A `DocumentMask` reaches TPU splash
    as a static mask and segment ids; the other paths take it dense."""
    scale = (q.shape[-1] if scale_dim is None else scale_dim) ** -0.5
    path = attention_path(impl, q, k, logit_cap)
    static = isinstance(mask, DocumentMask) and path == "pallas"
    if isinstance(mask, DocumentMask) and not static:
        mask = mask.dense()
    if path == "einsum":
        return _attend_einsum(q, k, v, mask, scale, logit_cap)
    if path == "xla":
        return jax.nn.dot_product_attention(q, k, v, mask=mask[:, None], scale=scale, implementation="xla")
    # The fused kernels skip or divide by zero on a row without keys: give it keys (every key; splash's
    # segment ids give padding the padding before it), then replace its output by the mean.
    if static:
        empty = mask.segment_ids == 0
        scaled = q * jnp.asarray(scale, q.dtype)
        out = splash.static_attention(scaled, k, v, mask.segment_ids, mask.window, mask.windows, logit_cap)
    else:
        empty = ~jnp.any(mask, axis=-1)
        mask = mask | empty[..., None]
        if path == "cudnn":
            out = jax.nn.dot_product_attention(
                q, k, v, mask=mask[:, None], scale=scale, implementation="cudnn"
            )
        else:
            out = splash.dynamic_attention(q * jnp.asarray(scale, q.dtype), k, v, mask, logit_cap)
    mean = jnp.repeat(jnp.mean(v.astype(jnp.float32), axis=1), q.shape[2] // k.shape[2], axis=1)
    return jnp.where(empty[..., None, None], mean[:, None].astype(out.dtype), out)


PRODUCT = "product"  # the checkpoint name of every `product`'s output: remat "dots" saves them


def product(
    spec: str, x: Float[Array, "*X"], w: Float[Array, "*W"], accumulate: Any = None
) -> Float[Array, "*Y"]:
    """einsum(spec, x, w) (a projection or the LM head; `accumulate`: the output's dtype, e.g. fp32 logits),
    whose backward writes each gradient in its operand's own axis order: the weight's as x . dy over the
    tokens. Autodiff's takes dy . x and transposes the result, which XLA:CPU runs as a transposed copy of
    dy and a slow generic dot (the weight gradients of PonderLM-2's step: ~90 against ~170 GF/s for the
    forward's products, one thread); written this way each is a plain matmul, as is the LM head's, whose
    logits' gradient autodiff's form also wrote transposed (nanochat 4 x 256: its gradient 127 -> 107 ms).
    Its output is named PRODUCT, which remat "dots" saves as it saves the einsums' (a custom VJP hides the
    dot from that policy)."""
    return checkpoint_name(_product(spec, x, w, accumulate), PRODUCT)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 3))
def _product(spec, x, w, accumulate):
    return jnp.einsum(spec, x, w, preferred_element_type=accumulate)


def _product_fwd(spec, x, w, accumulate):
    return _product(spec, x, w, accumulate), (x, w)


def _product_bwd(spec, accumulate, residuals, g):
    x, w = residuals
    (x_axes, w_axes), out_axes = spec.split("->")[0].split(","), spec.split("->")[1]
    dx = jnp.einsum(f"{out_axes},{w_axes}->{x_axes}", g, w, preferred_element_type=accumulate)
    dw = jnp.einsum(f"{x_axes},{out_axes}->{w_axes}", x, g, preferred_element_type=accumulate)
    return dx.astype(x.dtype), dw.astype(w.dtype)


_product.defvjp(_product_fwd, _product_bwd)


@jax.custom_vjp
def scores(q: Float[Array, "B K G T E"], k: Float[Array, "B K S E"]) -> Float[Array, "B K G T S"]:
    """q · k over e, in fp32, with a written-out VJP: the keys' gradient dS^T q contracts the T x S score
    gradient over its rows, and autodiff's form of it made XLA:CPU write that gradient transposed in every
    layer and pass; taken as (q^T dS)^T only the small q and the [E, S] result are transposed (the same
    sums: equal to autodiff; PonderLM-2's gradient at 512 slots 1.02 -> 0.92 s, one thread)."""
    return jnp.einsum("bkgte,bkse->bkgts", q, k, preferred_element_type=jnp.float32)


def _scores_fwd(q, k):
    return scores(q, k), (q, k)


def _scores_bwd(residuals, g):
    q, k = residuals
    dq = jnp.einsum("bkgts,bkse->bkgte", g, k, preferred_element_type=jnp.float32)
    dk = jnp.einsum("bkget,bkgts->bkes", jnp.swapaxes(q, -1, -2), g, preferred_element_type=jnp.float32)
    return dq.astype(q.dtype), jnp.swapaxes(dk, -1, -2).astype(k.dtype)


scores.defvjp(_scores_fwd, _scores_bwd)


def _attend_einsum(q, k, v, mask, scale: float, logit_cap: float | None):
    """The reference: fp32 B x H x T x S logits, masked, softmaxed."""
    # Head-major before the products: every product (and its transposes in the backward) is then a plain
    # batched matmul over the last axes, without a layout copy of the T x S logits or probabilities.
    q = rearrange(q, "b t (k g) e -> b k g t e", k=k.shape[2])
    k, v = (rearrange(x, "b s k e -> b k s e") for x in (k, v))
    logits = scores(q, k) * scale
    if logit_cap is not None:
        logits = softcap(logits, logit_cap)
    logits = jnp.where(mask[:, None, None], logits, NEG_INF)
    probs = softmax(logits).astype(v.dtype)
    out = jnp.einsum("bkgts,bkse->bkgte", probs, v)
    return rearrange(out, "b k g t e -> b t (k g) e")


def gated_mlp(
    x: Float[Array, "B T D"],
    gate_proj: Float[Array, "D F"],
    up_proj: Float[Array, "D F"],
    down_proj: Float[Array, "F D"],
    activation: Callable = jax.nn.silu,
) -> Float[Array, "B T D"]:
    """down(act(gate x) * up x): SwiGLU with SiLU (Llama), GeGLU with tanh-GELU (Gemma, HF's
    gelu_pytorch_tanh)."""
    gate = product("btd,df->btf", x, gate_proj)
    up = product("btd,df->btf", x, up_proj)
    return product("btf,fd->btd", activation(gate) * up, down_proj)


def _gelu_tanh(x):
    return jax.nn.gelu(x, approximate=True)


def relu2(
    x: Float[Array, "B T D"], up_proj: Float[Array, "D F"], down_proj: Float[Array, "F D"]
) -> Float[Array, "B T D"]:
    """nanochat's MLP: down(relu(up x)²)."""
    up = product("btd,df->btf", x, up_proj)
    return product("btf,fd->btd", jnp.square(jax.nn.relu(up)), down_proj)


# ---------------------------------------------------------------------------------------------
# Initialisation by role, per `ModelConfig.init_scheme`; every table (backbone, MLPs, variants) asks here.

ROLES = ("in", "mlp_in", "out", "embedding", "head", "gate", "token_gate")


def weight_init(cfg: ModelConfig, role: str):
    """The initializer of a weight by its role: an input projection ("in"; "mlp_in": the relu² MLP's), an
    output projection into the residual stream ("out"), the embedding table, the LM head, a zero-started
    gate projection ("gate"), or nanochat's gates on token embeddings ("token_gate": value embeddings',
    smear's)."""
    if role not in ROLES:
        raise ValueError(f"weight role must be one of {ROLES}, got {role!r}")
    karpathy = cfg.init_scheme == "nanochat_karpathy"
    if role == "token_gate" and karpathy:
        return lambda key, shape, dtype: jax.random.uniform(key, shape, dtype, 0.0, 0.02)
    if role in ("gate", "token_gate"):
        return zeros
    if cfg.init_scheme == "normal":
        return normal(cfg.init_std)
    return {
        "in": uniform(cfg.hidden_size**-0.5),
        "mlp_in": uniform((0.4 if karpathy else 1.0) * cfg.hidden_size**-0.5),
        "out": zeros,
        "embedding": normal(0.8 if karpathy else 1.0),
        "head": normal(0.001),
    }[role]


def layer_matrix(
    cfg: ModelConfig, shape: tuple, axes: tuple, in_dims: int = 1, role: str = "in"
) -> ParamSpec:
    """A per-layer projection [L, *shape], its first `in_dims` dims the fan-in, initialised by `role`."""
    return ParamSpec((cfg.num_layers, *shape), ("layers", *axes), weight_init(cfg, role), "matrix", in_dims)


# ---------------------------------------------------------------------------------------------
# The MLP registry: `ModelConfig.mlp` names an entry; the block and the parameter table only look it up.


class MLP(NamedTuple):
    """One MLP variant: its parameter table, its function and (optionally) its non-gradient state.

    specs(cfg) -> {name: ParamSpec}: the tree of params["layers"]["mlp"], every leaf stacked on a
      leading `layers` axis (kind, fan-in dims and logical axes as any ParamSpec).
    apply(cfg, p, x, state) -> (y, stats): one block's MLP on the normed stream x [B, T, D]; p and state
      are this layer's slices; stats are this layer's arrays to report (sums, so micro-batches add up),
      stacked over layers by `run_blocks`.
    init_state(cfg) -> state: per-layer arrays stacked on a leading layer axis (e.g. MoE routing biases).
    update_state(cfg, state, stats) -> (state, metrics): after each optimizer step, from the stats summed
      over the step's micro-batches; metrics are scalars to log.
    """

    specs: Callable[[ModelConfig], dict]
    apply: Callable[[ModelConfig, dict, Array, Any], tuple[Array, dict]]
    init_state: Callable[[ModelConfig], Any] | None = None
    update_state: Callable[[ModelConfig, Any, dict], tuple[Any, dict]] | None = None


MLPS: dict[str, MLP] = {}


def register_mlp(
    name: str,
    specs: Callable[[ModelConfig], dict],
    apply: Callable,
    *,
    init_state: Callable | None = None,
    update_state: Callable | None = None,
) -> None:
    """Make `ModelConfig(mlp=name)` valid and build its blocks with `apply` over the params of `specs`."""
    MLPS[name] = MLP(specs, apply, init_state, update_state)
    MLP_NAMES.add(name)


def _swiglu_specs(cfg: ModelConfig) -> dict:
    d, f = cfg.hidden_size, cfg.mlp_dim
    return {
        "gate_proj": layer_matrix(cfg, (d, f), ("embed", "mlp")),
        "up_proj": layer_matrix(cfg, (d, f), ("embed", "mlp")),
        "down_proj": layer_matrix(cfg, (f, d), ("mlp", "embed"), role="out"),
    }


def _relu2_specs(cfg: ModelConfig) -> dict:
    d, f = cfg.hidden_size, cfg.mlp_dim
    return {
        "up_proj": layer_matrix(cfg, (d, f), ("embed", "mlp"), role="mlp_in"),
        "down_proj": layer_matrix(cfg, (f, d), ("mlp", "embed"), role="out"),
    }


register_mlp(
    "swiglu",
    _swiglu_specs,
    lambda cfg, p, x, state: (gated_mlp(x, p["gate_proj"], p["up_proj"], p["down_proj"]), {}),
)
register_mlp(
    "geglu",
    _swiglu_specs,
    lambda cfg, p, x, state: (gated_mlp(x, p["gate_proj"], p["up_proj"], p["down_proj"], _gelu_tanh), {}),
)
register_mlp("relu2", _relu2_specs, lambda cfg, p, x, state: (relu2(x, p["up_proj"], p["down_proj"]), {}))
