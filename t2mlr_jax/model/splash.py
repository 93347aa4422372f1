"""TPU splash attention (Pallas) for `layers.attend`, on pre-scaled queries.

Two masks, as MaxText runs them:
- `static_attention`, for the backbone's own mask (`layers.DocumentMask`: causal within a document,
  optionally a sliding window): the kernel's mask is a causal or local mask object built at trace time
  (no mask tensor exists; blocks no query sees are skipped at compile time) and the documents are segment
  ids; the batch rows are vmapped into the kernel's grid.
- `dynamic_attention`, for a mask given as a [B, T, S] array: the kernel's dynamic block-sparse mask,
  built from each row's [T, S] mask, row by row (splash's mask is per kernel call, so rows with different
  masks cannot share one grid). The backbone builds one where the queries are not a call's own slots in
  order: recirculation's side-by-side pass (two copies of every token under one mask), a prefill or an
  LRT interleaved pass against a KV cache (queries at the cache's slots `index + t` or a pass's strided
  slots, keys every slot). Those masks are static given the slots too; expressing them as splash mask
  objects (an offset causal mask; a numpy mask of the strided pattern) is what remains to drop the mask
  tensor there.

Under a mesh each device runs the kernel on its own rows and heads (`shard_map` over the batch axes and,
when both head counts divide it, the tensor axis), as production JAX trainers do: the kernel is a custom
call XLA cannot partition itself. The kernels are imported inside the functions: Mosaic kernels need a
TPU, and nothing on CPU should import them (`interpret` runs them on CPU, for tests).

Letters: B batch, T query time, S key time, H query heads, K kv heads, E head dim.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from t2mlr_jax.parallel.rules import partition_spec

_heads_first = functools.partial(jnp.swapaxes, axis1=1, axis2=2)  # [B, T, N, E] <-> [B, N, T, E]


def _per_device(kernel: Callable, q, k, v, *per_row):
    """kernel(q, k, v, *per_row) on each device's rows (and heads, over the tensor axis, when both head
    counts split alike); `per_row` arrays are [B, ...], split with the rows."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return kernel(q, k, v, *per_row)
    b, _, h, _ = q.shape
    rows = partition_spec(("batch",), (b,), mesh)[0]
    heads = partition_spec(("act_heads",), (h,), mesh)[0]
    if heads != partition_spec(("act_heads",), (k.shape[2],), mesh)[0]:
        heads = None  # the kv heads do not split as the query heads do: each device keeps all heads
    spec = jax.sharding.PartitionSpec(rows, None, heads, None)
    row_specs = tuple(jax.sharding.PartitionSpec(rows, *[None] * (x.ndim - 1)) for x in per_row)
    # check_vma off: the kernel (pallas_call) declares no per-axis variance of its outputs (jax 0.10.2)
    sharded = jax.shard_map(
        kernel, mesh=mesh, in_specs=(spec, spec, spec, *row_specs), out_specs=spec, check_vma=False
    )
    return sharded(q, k, v, *per_row)


def static_attention(
    q: Float[Array, "B T H E"],
    k: Float[Array, "B T K E"],
    v: Float[Array, "B T K E"],
    segment_ids: Int[Array, "B T"],
    window: Int[Array, ""] | None,
    windows: tuple[int, ...],
    logit_cap: float | None,
    interpret: bool = False,
) -> Float[Array, "B T H E"]:
    """Causal attention within documents (equal segment ids; padding, id 0, sees the padding before it),
    each query seeing keys at most `window` slots back when a window is given. `window` may be traced (a
    layer's, scanned with the stack): it is one of the static `windows`, each of which gets its own
    static-mask kernel, the layer's picked by `lax.switch`."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

    def attention(width: int | None, q, k, v, segment_ids):
        _, t, h, _ = q.shape
        shape = (t, k.shape[1])
        causal = width is None or width >= t
        block = masks.CausalMask(shape) if causal else masks.LocalMask(shape, (width, 0), 0)
        kernel = splash.make_splash_mha(
            masks.MultiHeadMask((block,) * h),
            head_shards=1,
            q_seq_shards=1,
            attn_logits_soft_cap=logit_cap,
            interpret=interpret,
        )
        run = lambda q, k, v, ids: kernel(q, k, v, segment_ids=splash.SegmentIds(ids, ids))
        return _heads_first(jax.vmap(run)(*map(_heads_first, (q, k, v)), segment_ids))

    def with_window(width: int | None) -> Callable:
        return lambda *args: _per_device(functools.partial(attention, width), *args)

    if window is None:
        return with_window(None)(q, k, v, segment_ids)
    branch = jnp.argmax(jnp.asarray(windows) == window)
    return jax.lax.switch(branch, [with_window(w) for w in windows], q, k, v, segment_ids)


def dynamic_attention(
    q: Float[Array, "B T H E"],
    k: Float[Array, "B S K E"],
    v: Float[Array, "B S K E"],
    mask: Bool[Array, "B T S"],
    logit_cap: float | None,
    interpret: bool = False,
) -> Float[Array, "B T H E"]:
    """Attention under a mask that is data, each row's [T, S] mask as the kernel's dynamic block-sparse
    mask (skipping blocks no query sees). Every row of `mask` must see a key."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash

    def row(args):  # one batch row: q [H T E], k, v [K S E], mask [T S]
        q, k, v, mask = args
        kernel = splash.make_splash_mha_single_device(
            mask[None], attn_logits_soft_cap=logit_cap, interpret=interpret
        )
        # Under a trace, the kernel's jnp.array(is_dynamic_mask) flag becomes a tracer its __call__ branches
        # on (jax 0.10.2); a traced mask is always dynamic.
        kernel.fwd_mask_info = kernel.fwd_mask_info._replace(is_dynamic_mask=True)
        return kernel(q, k, v)

    def rows(q, k, v, mask):
        return _heads_first(jax.lax.map(row, (*map(_heads_first, (q, k, v)), mask)))

    return _per_device(rows, q, k, v, mask)
