"""The backbone: the default block is Llama exactly, RoPE layout, remat, untied head, NoPE, and runtime
shape checking. The configurable parts and the feedback hook are tested in test_blocks.py. fp32 bounds: the
depth rule of tests/tolerance.py (the layers a value passes; a gradient twice its forward's)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2mlr_jax.model import backbone, layers
from t2mlr_jax.model.layers import NEG_INF, attention_mask, rms_norm, rope, softmax
from tests.tiny import rel_err, tiny_config, tiny_params, tokens
from tests.tolerance import assert_fp32_close


def _llama_reference(cfg, params, toks):
    """The Llama forward written out with the formula the backbone had before its parts became
    configurable (hand-grouped GQA reshape, SwiGLU inline), under the same lax.scan over layers; each
    projection is one matmul over the flattened heads, as the backbone computes it."""
    b, t = toks.shape
    pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    mask = attention_mask(jnp.ones_like(toks), jnp.ones_like(toks), pos, pos)

    def proj(x, w):  # x [B T D] @ w [D N E] -> [B T N E]
        return (x @ w.reshape(w.shape[0], -1)).reshape(b, t, *w.shape[1:])

    def block(h, p):
        x = rms_norm(h, p["input_layernorm"], cfg.norm_eps)
        a = p["self_attn"]
        q = rope(proj(x, a["q_proj"]), pos, cfg.rope_theta)
        k = rope(proj(x, a["k_proj"]), pos, cfg.rope_theta)
        v = proj(x, a["v_proj"])
        n_kv, e = k.shape[2], q.shape[-1]
        q = q.reshape(b, t, n_kv, cfg.num_heads // n_kv, e).transpose(0, 2, 3, 1, 4)  # head-major
        k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
        logits = jnp.einsum("bkgte,bkse->bkgts", q, k, preferred_element_type=jnp.float32) * (e**-0.5)
        probs = jax.nn.softmax(jnp.where(mask[:, None, None], logits, NEG_INF), axis=-1).astype(v.dtype)
        out = (
            jnp.einsum("bkgts,bkse->bkgte", probs, v).transpose(0, 3, 1, 2, 4).reshape(b, t, cfg.num_heads, e)
        )
        h = h + out.reshape(b, t, -1) @ a["o_proj"].reshape(-1, h.shape[-1])
        m = p["mlp"]
        x = rms_norm(h, p["post_attention_layernorm"], cfg.norm_eps)
        gate = jnp.einsum("btd,df->btf", x, m["gate_proj"])
        up = jnp.einsum("btd,df->btf", x, m["up_proj"])
        return h + jnp.einsum("btf,fd->btd", jax.nn.silu(gate) * up, m["down_proj"]), None

    layers = jax.tree.map(lambda a: a.astype(cfg.dtype), params["layers"])
    h, _ = jax.lax.scan(block, jnp.take(params["embed_tokens"], toks, axis=0).astype(cfg.dtype), layers)
    x = rms_norm(h, params["norm"].astype(cfg.dtype), cfg.norm_eps)
    if cfg.tie_embeddings:
        w = params["embed_tokens"].astype(cfg.dtype)
        return jnp.einsum("btd,vd->btv", x, w, preferred_element_type=jnp.float32)
    w = params["lm_head"].astype(cfg.dtype)
    return jnp.einsum("btd,dv->btv", x, w, preferred_element_type=jnp.float32)


@pytest.mark.parametrize(
    "changes", [{}, dict(tie_embeddings=False, rope_theta=None), dict(dtype="bfloat16")], ids=str
)
def test_default_block_is_llama_bit_for_bit(changes):
    """With every block field at its default, the forward is exactly (array_equal) the Llama formula."""
    cfg = tiny_config(recurrence=None, **changes)
    params, toks = tiny_params(cfg, seed=3), tokens(2, 9)
    assert set(params["layers"]) == {"input_layernorm", "self_attn", "post_attention_layernorm", "mlp"}
    assert set(params["layers"]["mlp"]) == {"gate_proj", "up_proj", "down_proj"}
    assert set(params["layers"]["self_attn"]) == {"q_proj", "k_proj", "v_proj", "o_proj"}
    got = jax.jit(backbone.forward, static_argnums=0)(cfg, params, toks)
    want = jax.jit(_llama_reference, static_argnums=0)(cfg, params, toks)
    assert np.array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.numerics
def test_rope_is_hf_rotate_half():
    """Pairs (i, i + E/2) rotate by position * theta^(-2i/E), as HF's rotate_half does."""
    e, theta = 8, 100.0
    x = jax.random.normal(jax.random.PRNGKey(0), (1, 3, 2, e))
    pos = jnp.array([[0, 1, 5]])
    out = np.asarray(rope(x, pos, theta))
    freq = theta ** (-np.arange(e // 2) * 2.0 / e)
    ang = np.asarray(pos)[..., None, None] * freq
    z = (np.asarray(x[..., : e // 2]) + 1j * np.asarray(x[..., e // 2 :])) * np.exp(1j * ang)
    assert_fp32_close(out, np.concatenate([z.real, z.imag], -1), 1, "rope")  # one op against float64
    np.testing.assert_array_equal(rope(x, pos, None), x)  # NoPE


@pytest.mark.numerics
@pytest.mark.parametrize("remat", ["full", "dots"])
def test_remat_changes_nothing_but_memory(remat):
    cfg = tiny_config(recurrence=None)
    params = tiny_params(cfg)
    toks = tokens(2, 8)
    loss = lambda c: jax.value_and_grad(lambda p: backbone.forward(c, p, toks).std())(params)
    (v0, g0), (v1, g1) = loss(cfg), loss(cfg.replace(remat=remat))
    assert_fp32_close(v1, v0, cfg.num_layers, "loss")
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g1), jax.tree.leaves(g0)):  # own scales
        assert_fp32_close(a, b, 2 * cfg.num_layers, jax.tree_util.keystr(path))  # there and back


def test_untied_head_and_nope_models_run():
    cfg = tiny_config(recurrence=None, tie_embeddings=False, rope_theta=None)
    params = tiny_params(cfg)
    assert params["lm_head"].shape == (cfg.hidden_size, cfg.vocab_size)
    logits = backbone.forward(cfg, params, tokens(2, 8))
    assert logits.shape == (2, 8, cfg.vocab_size) and logits.dtype == jnp.float32


def test_bf16_compute_keeps_fp32_params_and_logits():
    cfg = tiny_config(recurrence=None, dtype="bfloat16")
    params = tiny_params(cfg)
    assert params["embed_tokens"].dtype == jnp.float32
    logits = backbone.forward(cfg, params, tokens(2, 8))
    ref = backbone.forward(cfg.replace(dtype="float32"), params, tokens(2, 8))
    # bf16 against fp32: 2^-8 relative per rounding over 4 layers, not an fp32 bound
    assert logits.dtype == jnp.float32 and rel_err(logits, ref) < 5e-2


def test_shape_annotations_are_checked_at_run_time():
    cfg = tiny_config(recurrence=None)
    params = tiny_params(cfg)
    h = jnp.zeros((2, 8, cfg.hidden_size))
    with pytest.raises(Exception, match="positions|Type-check|type"):
        backbone.run_blocks(
            cfg,
            params,
            h,
            0,
            2,
            positions=jnp.zeros((2, 7), jnp.int32),
            segment_ids=jnp.ones((2, 8), jnp.int32),
        )


@pytest.mark.slow
@pytest.mark.numerics
@pytest.mark.parametrize("weighted, offset", [(True, False), (True, True), (False, False)])
def test_rms_norm_and_softmax_gradients_are_autodiffs(weighted, offset):
    """Their written-out VJPs (reductions as products with ones on a CPU) equal the autodiff of the
    plain formulas, and the forward is the formula bit for bit."""

    def plain_rms(x, w):
        y = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-5)
        return y if w is None else y * (1.0 + w if offset else w)

    ours_rms = lambda x, w: rms_norm(x, w, 1e-5, offset)
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 5, 3, 16))
    w = jax.random.normal(jax.random.PRNGKey(1), (16,)) if weighted else None
    probe = jax.random.normal(jax.random.PRNGKey(2), x.shape)
    np.testing.assert_array_equal(ours_rms(x, w), plain_rms(x, w))
    argnums = (0, 1) if weighted else 0
    grads = [jax.grad(lambda x, w: (f(x, w) * probe).sum(), argnums)(x, w) for f in (ours_rms, plain_rms)]
    for got, want in zip(*map(jax.tree.leaves, grads)):  # one op forward and back: depth 2
        assert_fp32_close(got, want, 2, "rms_norm gradient")
    softmaxes = (softmax, lambda z: jax.nn.softmax(z, axis=-1))
    grads = [jax.grad(lambda z: (f(z) * probe).sum())(x) for f in softmaxes]
    assert_fp32_close(*grads, 2, "softmax gradient")


@pytest.mark.numerics
@pytest.mark.parametrize(
    "spec,accumulate", [("btd,dv->btv", jnp.float32), ("btd,vd->btv", jnp.float32), ("btd,dv->btv", None)]
)
def test_the_products_and_scores_gradients_are_autodiffs(spec, accumulate, capsys):
    """The written-out VJPs of `product` (the LM head, untied and tied, with fp32 logits; a block's
    projection) and of the attention scores (each gradient in its operand's own axis order; the keys' as
    (q^T dS)^T) equal autodiff of the plain einsums; the forwards are the einsums, under remat "dots" too
    (which saves a product's output as it saves an einsum's)."""
    keys = jax.random.split(jax.random.PRNGKey(0), 6)
    x, w = (
        jax.random.normal(keys[0], (2, 5, 8)),
        jax.random.normal(keys[1], (8, 11) if "dv" in spec else (11, 8)),
    )
    q, k = jax.random.normal(keys[2], (2, 2, 3, 5, 4)), jax.random.normal(keys[3], (2, 2, 7, 4))
    cases = [
        (
            functools.partial(layers.product, spec, accumulate=accumulate),
            lambda a, b: jnp.einsum(spec, a, b, preferred_element_type=accumulate),
            (x, w),
            keys[4],
        ),
        (layers.scores, lambda a, b: jnp.einsum("bkgte,bkse->bkgts", a, b), (q, k), keys[5]),
    ]
    for ours, plain, args, key in cases:
        np.testing.assert_array_equal(ours(*args), plain(*args))
        probe = jax.random.normal(key, plain(*args).shape)
        loss = lambda f: lambda a, b: (jnp.tanh(f(a, b)) * probe).sum()
        got, want = (jax.grad(loss(f), (0, 1))(*args) for f in (ours, plain))
        dots = backbone._remat(tiny_config(remat="dots"), loss(ours))
        for g, r, d in zip(got, want, jax.grad(dots, (0, 1))(*args)):  # one product: depth 1
            assert g.shape == r.shape
            assert_fp32_close(g, r, 1, "written-out VJP")
            np.testing.assert_array_equal(d, g)
    saved = backbone._remat(
        tiny_config(remat="dots"), lambda a, b: jnp.tanh(layers.product(spec, a, b)).sum()
    )
    jax.ad_checkpoint.print_saved_residuals(saved, x, w)
    assert "named 'product'" in capsys.readouterr().out
