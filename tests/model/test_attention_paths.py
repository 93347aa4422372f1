"""`attend`'s implementations (ModelConfig.attention_impl) equal the reference einsum on every mask the
backbone builds, and a call whose inputs a kernel cannot take falls back instead of running it.

Bounds (tests/tolerance.py): one attention call by the float64 rule against `attention64`, measured against
the einsum path's own error (depth 1): the queries and keys here are drawn at 2x, so the logits reach ~10
and the softmax's round-off grows with them (exp's relative error is u * |logit|), which a per-block
bound sized on the tiny models' O(1) logits does not hold. The model forwards by the depth rule, their
depth test_recurrence's `chain`.

CPU timing behind "auto" -> einsum: 30 SmolLM2-135M attention layers (9 query / 3 kv heads, head_dim 64,
fp32) in one jit, einsum time / xla time, interleaved runs on 2 shared cores: train B=4 T=256 forward
1.10-1.25, forward + backward 0.97-1.03; decode B=4 T=1 against 512 slots 0.94-0.99. XLA's
dot_product_attention does the same fp32 logits and softmax: a wash for a training step, a little slower
decoding.
"""

import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2mlr_jax.architectures.t2mlr.recurrence import exact_forward, jacobi_forward
from t2mlr_jax.model import layers, splash
from t2mlr_jax.model.backbone import FULL_WINDOW
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.layers import DocumentMask, attend, attention_mask, attention_path
from t2mlr_jax.model.token_layout import make_layout
from t2mlr_jax.studies.parity import recurrence_layers
from tests.tiny import tiny_config, tiny_params, tokens
from tests.tolerance import assert_fp32_close, assert_near_f64


def qkv(b, t, s, heads=6, kv_heads=2, e=8, dtype=jnp.float32):
    keys = jax.random.split(jax.random.PRNGKey(t * 100 + s), 3)
    q = jax.random.normal(keys[0], (b, t, heads, e)) * 2
    k = jax.random.normal(keys[1], (b, s, kv_heads, e)) * 2
    return q.astype(dtype), k.astype(dtype), jax.random.normal(keys[2], (b, s, kv_heads, e)).astype(dtype)


def attention64(q, k, v, mask, logit_cap=None, scale_dim=None):
    """`attend` in float64 numpy: grouped-query softmax attention, a query that sees no key averaging all
    values (its logits all NEG_INF)."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    b, t, h, e = q.shape
    z = np.einsum("btkge,bske->bkgts", q.reshape(b, t, k.shape[2], -1, e), k) * (scale_dim or e) ** -0.5
    if logit_cap is not None:
        z = logit_cap * np.tanh(z / logit_cap)
    z = np.where(np.asarray(mask)[:, None, None], z, layers.NEG_INF)
    p = np.exp(z - z.max(-1, keepdims=True))
    return np.einsum("bkgts,bske->btkge", p / p.sum(-1, keepdims=True), v).reshape(b, t, h, e)


def check(q, k, v, mask, logit_cap=None, scale_dim=None, what="attention"):
    """The xla path within the float64 rule, measured against the einsum path's error (one op: depth 1)."""
    got, want = (attend(q, k, v, mask, logit_cap, scale_dim, impl) for impl in ("xla", "einsum"))
    assert_near_f64(got, want, attention64(q, k, v, mask, logit_cap, scale_dim), 1, what)


def self_mask(segments, window=None):
    """The backbone's mask without a cache: causal within a document, optionally a sliding window."""
    segments = jnp.asarray(segments, jnp.int32)
    slots = jnp.broadcast_to(jnp.arange(segments.shape[1]), segments.shape)
    mask = attention_mask(segments, segments, slots, slots)
    return mask if window is None else mask & (slots[:, :, None] - slots[:, None, :] <= window)


MASKS = {
    "packed_documents": lambda: self_mask([[1, 1, 1, 2, 2, 2, 2, 3, 3, 3], [1] * 10]),
    "left_padding": lambda: self_mask([[0, 0, 0, 0, 1, 1, 1, 1, 1, 1], [0] + [1] * 9]),
    "causal_sliding_window": lambda: self_mask([[1] * 10, [0, 0] + [1] * 4 + [2] * 4], window=3),
    # recirculation's custom masks are arbitrary: a random one, an empty row included
    "custom": lambda: jax.random.bernoulli(jax.random.PRNGKey(3), 0.4, (2, 10, 10)).at[0, 2].set(False),
}


@pytest.mark.numerics
@pytest.mark.parametrize("name", MASKS)
@pytest.mark.parametrize("kv_heads", [2, 1, 6])
def test_xla_equals_the_reference_on_the_backbone_masks(name, kv_heads):
    q, k, v = qkv(2, 10, 10, kv_heads=kv_heads)
    mask = MASKS[name]()
    check(q, k, v, mask)
    check(q, k, v, mask, scale_dim=5.0, what="scaled")


@pytest.mark.numerics
def test_xla_decode_step_against_a_partly_filled_cache_equals_the_reference():
    s, index = 16, 9  # slots [0, 9) hold the prompt, this step writes slot 9, the rest are empty
    k_segments = np.zeros((2, s), np.int32)
    k_segments[0, : index + 1] = 1
    k_segments[1, 4 : index + 1] = 1  # left-padded row
    q_segments = jnp.ones((2, 1), jnp.int32)
    mask = attention_mask(
        q_segments, jnp.asarray(k_segments), jnp.full((2, 1), index), jnp.broadcast_to(jnp.arange(s), (2, s))
    )
    q, k, v = qkv(2, 1, s)
    check(q, k, v, mask, what="decode step")
    check(q, k, v, mask & False, what="padding")  # a padding token's step sees no slot


@pytest.mark.numerics
def test_softcap_falls_back_to_the_reference():
    q, k, v = qkv(2, 10, 10)
    mask = MASKS["packed_documents"]()
    assert attention_path("xla", q, k, None) == "xla"
    assert attention_path("xla", q, k, 2.0) == "einsum"
    check(q, k, v, mask, logit_cap=2.0, what="softcap")


SPLASH_SEGMENTS = [[0] * 30 + [1] * 100 + [2] * 126, [1] * 256]  # two 128-slot blocks: some skipped


@pytest.fixture
def splash_on_cpu(monkeypatch):
    """`attend` taking its TPU splash paths, their kernels run by Pallas's interpreter on this CPU."""
    monkeypatch.setattr(layers, "attention_path", lambda *args: "pallas")
    for name in ("static_attention", "dynamic_attention"):
        monkeypatch.setattr(splash, name, functools.partial(getattr(splash, name), interpret=True))


@pytest.mark.numerics
@pytest.mark.parametrize(
    "window, windows",
    [(None, ()), (40, (40, FULL_WINDOW)), (FULL_WINDOW, (40, FULL_WINDOW))],
    ids=["causal", "sliding_window", "full_layer_of_a_windowed_stack"],
)
def test_splash_static_mask_equals_the_reference(splash_on_cpu, window, windows):
    """The backbone's DocumentMask reaches splash as a static causal / local mask and segment ids (the
    window picked among the stack's by lax.switch): equal to the float64 reference, padding rows (their
    mean of all values) included, and its gradients equal the einsum path's."""
    q, k, v = qkv(2, 256, 256)
    mask = DocumentMask(jnp.asarray(SPLASH_SEGMENTS, jnp.int32), window and jnp.int32(window), windows)
    run = jax.jit(lambda q, k, v, mask: attend(q, k, v, mask, impl="pallas"))
    assert_near_f64(run(q, k, v, mask), _einsum(q, k, v, mask), attention64(q, k, v, mask.dense()), 1)
    grads = lambda fn: jax.grad(lambda q, k, v: jnp.sum(jnp.sin(fn(q, k, v, mask))), (0, 1, 2))(q, k, v)
    for got, want in zip(grads(run), grads(_einsum)):
        assert_fp32_close(got, want, 2, "gradient")


@pytest.mark.numerics
def test_splash_dynamic_mask_equals_the_reference(splash_on_cpu):
    """A mask that is data (recirculation's, an empty row included) runs splash's dynamic block mask."""
    q, k, v = qkv(2, 128, 256)
    mask = jax.random.bernoulli(jax.random.PRNGKey(3), 0.4, (2, 128, 256)).at[0, 2].set(False)
    got = jax.jit(lambda q, k, v: attend(q, k, v, mask, impl="pallas"))(q, k, v)
    assert_near_f64(got, _einsum(q, k, v, mask), attention64(q, k, v, mask), 1)


def _einsum(q, k, v, mask):
    return attend(q, k, v, mask.dense() if isinstance(mask, DocumentMask) else mask, impl="einsum")


def test_gpu_and_tpu_kernels_are_refused_on_cpu_and_never_imported():
    q, k, _ = qkv(1, 4, 4)
    for impl, platform in (("cudnn", "gpu"), ("pallas", "tpu")):
        with pytest.raises(ValueError, match=f"attention_impl='{impl}' needs a {platform} backend, not cpu"):
            attention_path(impl, q, k, None)
    assert attention_path("auto", q, k, None) == layers.CPU_ATTENTION
    tpu_kernels = lambda: {
        name for name in sys.modules if "splash_attention" in name or "pallas.ops.tpu" in name
    }
    before = tpu_kernels()  # (tests that compile for a TPU import them: this run's CPU attention must not)
    attend(q, k, k, jnp.ones((1, 4, 4), bool), impl="auto")
    assert tpu_kernels() == before


@pytest.mark.parametrize(
    "platform, impl, t, s, dtype, cap, path",
    [
        ("gpu", "auto", 128, 128, jnp.bfloat16, None, "cudnn"),
        ("gpu", "cudnn", 128, 128, jnp.float32, None, "xla"),  # cuDNN's flash attention: half precision
        ("gpu", "cudnn", 1, 128, jnp.bfloat16, None, "xla"),  # odd length with a mask bias
        ("gpu", "auto", 128, 128, jnp.bfloat16, 2.0, "einsum"),  # softcap: neither cuDNN nor XLA's
        ("tpu", "auto", 256, 128, jnp.bfloat16, 2.0, "pallas"),  # splash has the softcap
        ("tpu", "pallas", 1, 256, jnp.float32, None, "xla"),  # a decode step does not tile into blocks
        ("tpu", "auto", 100, 100, jnp.float32, 2.0, "einsum"),
    ],
)
def test_each_platform_picks_its_kernel_and_falls_back_by_static_facts(
    monkeypatch, platform, impl, t, s, dtype, cap, path
):
    monkeypatch.setattr(jax, "default_backend", lambda: platform)
    q, k, _ = qkv(1, t, s, heads=4, kv_heads=2, e=64, dtype=dtype)
    assert attention_path(impl, q, k, cap) == path


def test_a_bad_attention_impl_is_a_one_line_value_error():
    with pytest.raises(
        ValueError, match=r"^attention_impl must be one of \('auto', .*'pallas'\), got 'flash'$"
    ):
        tiny_config(attention_impl="flash")
    q, k, v = qkv(1, 2, 2)
    with pytest.raises(ValueError, match="attention_impl must be one of"):
        attend(q, k, v, jnp.ones((1, 2, 2), bool), impl="flash")
    assert ModelConfig.attention_impl == "auto"


@pytest.mark.numerics
def test_tiny_model_forwards_with_xla_attention_equal_einsum():
    """Jacobi (parallel blocks) and the exact recurrence (KV-cache decode steps) on packed, left-padded rows
    with sliding-window layers."""
    cfg = tiny_config(window_pattern="SL", sliding_window=3)
    params = tiny_params(cfg, gamma=0.8)
    toks = tokens(2, 12)
    segments = jnp.asarray([[0, 0, 0] + [1] * 9, [1] * 5 + [2] * 7], jnp.int32)
    positions = jnp.asarray([[0, 0, 0, *range(9)], [*range(5), *range(7)]], jnp.int32)
    layout = make_layout(toks, positions, segments)
    jacobi = jax.jit(jacobi_forward, static_argnums=0, static_argnames=("d_forward", "d_backward"))
    exact = jax.jit(exact_forward, static_argnums=0)
    for run, depth in (  # D = 4 passes; the recurrence over 9 tokens (row 0's document)
        (
            lambda c: jacobi(c, params, toks, layout=layout, d_forward=4, d_backward=2),
            recurrence_layers(cfg, 4),
        ),
        (lambda c: exact(c, params, toks, layout=layout), recurrence_layers(cfg, 9)),
    ):
        want, got = run(cfg.replace(attention_impl="einsum")), run(cfg.replace(attention_impl="xla"))
        assert_fp32_close(got.logits, want.logits, depth, "logits")
        assert_fp32_close(got.recurrent_state, want.recurrent_state, depth, "R")
