"""The block's configurable parts (QK-norm, sliding windows, softcaps, MLP registry, weightless norms,
embedding norm) and the per-block feedback hook; every option also decodes through the KV cache. fp32
equalities: the depth rule of tests/tolerance.py, the depth the blocks a value passes (one op: 1)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2mlr_jax.model import backbone, layer_layout
from t2mlr_jax.model.block import Feedback
from t2mlr_jax.model.config import MLP_NAMES
from t2mlr_jax.model.layers import MLPS, attend, attention_mask, register_mlp, relu2, softcap
from t2mlr_jax.model.params import param_axes, param_specs
from t2mlr_jax.model.spec import ParamSpec, ones, spec_leaves
from tests.tiny import NANOCHAT_BLOCK, tiny_config, tiny_params, tokens
from tests.tolerance import assert_fp32_close, assert_near_f64

BASE = tiny_config(recurrence=None)
TOKS = tokens(2, 10)
B, T = TOKS.shape
D, L, K, E = BASE.hidden_size, BASE.num_layers, BASE.num_kv_heads, BASE.head_dim
LAYOUT = dict(zip(("positions", "segment_ids"), backbone.default_layout(TOKS)))
forward = jax.jit(backbone.forward, static_argnums=0)


def _blocks(cfg, params, h, start, end, feedback_params=None, memory=None, lrt=False):
    fb = _lrt_feedback(feedback_params, memory) if lrt else None
    return backbone.run_blocks(cfg, params, h, start, end, **LAYOUT, feedback=fb).h


run_blocks = jax.jit(_blocks, static_argnums=(0, 3, 4, 7))


def differs(a, b) -> bool:
    """A change that does something: it moves values far above round-off (a tiny forward's own is below the
    depth rule's 4 * 4 layers * u * scale, ~1e-6 at the scales here)."""
    return not np.allclose(np.asarray(a), np.asarray(b), atol=1e-6)


@pytest.mark.numerics
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_unstacked_layers_run_unrolled_and_equal_the_scan(dtype):
    """`unstack_layers`' per-layer form runs without a cache too (unrolled): the same as the stacked scan;
    so do per-layer weights left in the param dtype (model.scan_layers=False), cast as the stack is."""
    cfg = BASE.replace(dtype=dtype)
    params = tiny_params(cfg)
    h = backbone.embed(cfg, params, TOKS)
    scanned = run_blocks(cfg, params, h, 1, L)
    unstacked = run_blocks(cfg, backbone.unstack_layers(cfg, params), h, 1, L)
    assert unstacked.dtype == scanned.dtype == h.dtype
    if dtype == "float32":
        assert_fp32_close(unstacked, scanned, L - 1, "unstacked")  # blocks 1..L-1
    else:  # bf16: 8 bits, 2^-8 relative per rounding
        np.testing.assert_allclose(unstacked.astype(float), scanned.astype(float), atol=0.05, rtol=0.02)
    np.testing.assert_array_equal(run_blocks(cfg, layer_layout.per_layer(params), h, 1, L), unstacked)


# ---------------------------------------------------------------------------------------------
# Config


@pytest.mark.parametrize(
    "changes,field",
    [
        (dict(qk_norm="post"), "qk_norm"),
        (dict(window_pattern="SXL"), "window_pattern"),
        (dict(window_pattern=""), "window_pattern"),
        (dict(window_pattern="SL"), "sliding_window"),
        (dict(window_pattern="SL", sliding_window=0), "sliding_window"),
        (dict(sliding_window=4), "sliding_window"),
        (dict(attn_softcap=0.0), "attn_softcap"),
        (dict(logit_softcap=-1.0), "logit_softcap"),
        (dict(mlp="gelu"), "mlp"),
        (dict(norm_offset=True, norm_weights=False), "norm_offset"),
        (dict(query_pre_attn_scalar=0.0), "query_pre_attn_scalar"),
        (dict(rope_local_theta=-1.0), "rope_local_theta"),
        (dict(rope_local_theta=100.0, rope_theta=None), "rope_local_theta"),
    ],
)
def test_bad_block_options_name_their_field(changes, field):
    with pytest.raises(ValueError, match=f"^{field} "):
        BASE.replace(**changes)


def test_window_pattern_tiles_and_the_last_layer_is_full():
    cfg = BASE.replace(num_layers=6, window_pattern="SSSL", sliding_window=3)
    assert cfg.layer_windows == (3, 3, 3, None, 3, None)
    assert BASE.replace(window_pattern="S", sliding_window=3).layer_windows == (3, 3, 3, None)
    assert BASE.replace(num_layers=1, window_pattern="S", sliding_window=3).layer_windows == (None,)
    assert BASE.layer_windows == (None,) * L


def test_window_pattern_places_the_last_layer_too_when_asked():
    """last_layer_full=False: the pattern tiles over every layer (Gemma3 1B: "SSSSSL" over 26 layers, the
    last two sliding); a string of num_layers kinds places each layer as it says."""

    def windows(pattern, num_layers=L, last_layer_full=False):
        cfg = BASE.replace(num_layers=num_layers, window_pattern=pattern, sliding_window=3)
        return cfg.replace(last_layer_full=last_layer_full).layer_windows

    assert [i for i, w in enumerate(windows("SSSSSL", 26)) if w is None] == [5, 11, 17, 23]
    assert windows("SSSSSL", 26)[-2:] == (3, 3) and windows("SSSSSL", 26, True)[-2:] == (3, None)
    assert windows("LSS", 4) == (None, 3, 3, None) and windows("LSSS", 4) == (None, 3, 3, 3)
    assert windows("S", 1) == (3,) and windows("S", 1, True) == (None,)
    # An L-ending pattern of num_layers kinds is the same with either setting.
    assert windows("SLSL", 4) == windows("SLSL", 4, True) == (3, None, 3, None)


def test_new_parameters_have_specs_and_known_axes():
    cfg = BASE.replace(qk_norm="before_rope", embed_norm=True, mlp="relu2")
    specs = spec_leaves(param_specs(cfg))
    assert specs[("layers", "self_attn", "q_norm")].shape == (L, E)
    assert specs[("layers", "self_attn", "k_norm")].kind == "norm"
    assert specs[("embed_norm",)].shape == (D,)
    up, down = specs[("layers", "mlp", "up_proj")], specs[("layers", "mlp", "down_proj")]
    assert (up.shape, up.kind, up.fan_in) == ((L, D, cfg.mlp_dim), "matrix", (1,))
    assert (down.shape, down.fan_in, down.fan_out) == ((L, cfg.mlp_dim, D), (1,), (2,))
    assert ("layers", "mlp", "gate_proj") not in specs
    jax.tree.map(lambda *_: None, param_axes(cfg), tiny_params(cfg), is_leaf=lambda x: isinstance(x, tuple))


# ---------------------------------------------------------------------------------------------
# Parts


def test_weightless_norms_have_no_params_and_equal_unit_scales():
    cfg = BASE.replace(norm_weights=False, qk_norm="after_rope", embed_norm=True)
    params = tiny_params(cfg)
    assert "norm" not in params and "embed_norm" not in params
    assert set(params["layers"]) == {"self_attn", "mlp"}
    assert set(params["layers"]["self_attn"]) == {"q_proj", "k_proj", "v_proj", "o_proj"}
    ones = dict(params, norm=jnp.ones(D), embed_norm=jnp.ones(D))
    ones["layers"] = dict(
        params["layers"],
        input_layernorm=jnp.ones((L, D)),
        post_attention_layernorm=jnp.ones((L, D)),
        self_attn=dict(params["layers"]["self_attn"], q_norm=jnp.ones((L, E)), k_norm=jnp.ones((L, E))),
    )
    weighted = cfg.replace(norm_weights=True)
    assert np.array_equal(forward(cfg, params, TOKS), forward(weighted, ones, TOKS))


@pytest.mark.numerics
def test_offset_norms_start_at_zero_and_equal_plain_norms_at_one_plus_the_offset():
    """norm_offset (Gemma's (1 + w)) is a reparametrisation of the plain norm; sandwich norms add the
    pre_ / post_feedforward_layernorm only when on."""
    cfg = BASE.replace(norm_offset=True, qk_norm="before_rope", embed_norm=True)
    params = tiny_params(cfg)
    norms = lambda tree: [x for path, x in jax.tree_util.tree_leaves_with_path(tree) if "norm" in str(path)]
    assert all(not np.any(np.asarray(x)) for x in norms(params))  # the identity at init
    offsets = jax.tree_util.tree_map_with_path(
        lambda path, x: (
            x + 0.3 * jax.random.normal(jax.random.PRNGKey(5), x.shape) if "norm" in str(path) else x
        ),
        params,
    )
    plain = jax.tree_util.tree_map_with_path(lambda path, x: x + 1.0 if "norm" in str(path) else x, offsets)
    assert_fp32_close(forward(cfg, offsets, TOKS), forward(cfg.replace(norm_offset=False), plain, TOKS), L)
    assert "pre_feedforward_layernorm" not in params["layers"]
    sandwich = tiny_params(cfg.replace(sandwich_norms=True))["layers"]
    assert {"pre_feedforward_layernorm", "post_feedforward_layernorm"} <= set(sandwich)


def test_embed_norm_gives_unit_rms_embeddings_and_changes_the_output():
    cfg = BASE.replace(embed_norm=True, norm_weights=False, norm_eps=1e-12)
    params = tiny_params(cfg)
    h = backbone.embed(cfg, params, TOKS)
    # unit RMS, measured again in fp32 (a mean over D and a root: round-off ~1e-7); 1e-4 is far below a
    # missing norm's error
    np.testing.assert_allclose(jnp.sqrt(jnp.mean(h * h, -1)), 1.0, rtol=1e-4)
    assert differs(forward(cfg, params, TOKS), forward(cfg.replace(embed_norm=False), params, TOKS))


@pytest.mark.numerics
def test_qk_norm_orders_differ_with_learned_scales_and_agree_without():
    """RoPE rotates pairs, so it keeps the RMS of a head: a weightless QK-norm commutes with it, a
    per-channel scale does not (Qwen3's before-RoPE and nanochat's after-RoPE differ only then)."""
    before = BASE.replace(qk_norm="before_rope")
    params = tiny_params(before)
    attn = params["layers"]["self_attn"]
    for i, name in enumerate(("q_norm", "k_norm")):
        attn[name] = 1.0 + jax.random.uniform(jax.random.PRNGKey(i), (L, E))
    after = before.replace(qk_norm="after_rope")
    out_before, out_after = forward(before, params, TOKS), forward(after, params, TOKS)
    plain = {k: v for k, v in attn.items() if not k.endswith("_norm")}
    out_none = forward(BASE, dict(params, layers=dict(params["layers"], self_attn=plain)), TOKS)
    assert differs(out_before, out_after) and differs(out_before, out_none) and differs(out_after, out_none)
    nw = tiny_params(before.replace(norm_weights=False))
    weightless = lambda cfg: forward(cfg.replace(norm_weights=False), nw, TOKS)
    assert_fp32_close(weightless(before), weightless(after), L)


def test_sliding_window_hides_tokens_beyond_it():
    """Pattern SL: layers 0, 2 see keys <= w slots back, layers 1, 3 everything. Perturb the stream at
    slot 0 and see which queries move, per layer range (the window array is sliced like the params)."""
    w = 3
    cfg = BASE.replace(window_pattern="SL", sliding_window=w)
    params = tiny_params(cfg)
    h = jax.random.normal(jax.random.PRNGKey(5), (B, T, D))
    bumped = h.at[:, 0].add(1.0)

    def moved(cfg, start, end):  # per query slot: how far the output moved
        diff = run_blocks(cfg, params, bumped, start, end) - run_blocks(cfg, params, h, start, end)
        return np.abs(diff).max(axis=(0, 2))

    for windowed_layer in (0, 2):
        reach = moved(cfg, windowed_layer, windowed_layer + 1)
        assert (reach[: w + 1] > 1e-4).all() and (reach[w + 1 :] == 0).all()
    assert (moved(cfg, 1, 2) > 1e-4).all()  # a full layer
    assert (moved(cfg, 0, 2) > 1e-4).all()
    assert (moved(BASE, 0, 1) > 1e-4).all()  # layer 0 without the window


@pytest.mark.numerics
def test_attention_softcap_is_the_capped_formula():
    q = jax.random.normal(jax.random.PRNGKey(1), (B, T, 4, E)) * 3
    k = jax.random.normal(jax.random.PRNGKey(2), (B, T, 2, E)) * 3
    v = jax.random.normal(jax.random.PRNGKey(3), (B, T, 2, E))
    pos = jnp.broadcast_to(jnp.arange(T), (B, T))
    mask = attention_mask(jnp.ones((B, T), int), jnp.ones((B, T), int), pos, pos)

    def formula(dtype):
        q_, k_, v_ = (np.asarray(a, dtype) for a in (q, k, v))
        z = np.einsum("btkge,bske->bkgts", q_.reshape(B, T, 2, 2, E), k_) / np.sqrt(dtype(E))
        z = np.where(np.asarray(mask)[:, None, None], 2.0 * np.tanh(z / 2.0), -np.inf)
        p = np.exp(z - z.max(-1, keepdims=True))
        return np.einsum("bkgts,bske->btkge", p / p.sum(-1, keepdims=True), v_).reshape(B, T, 4, E)

    # the float64 rule (one attention: depth 1), measured against the formula's own fp32 error: the two
    # fp32 evaluations differ by 4.4 u * scale, over the depth rule's 4 for a block
    want = formula(np.float32)
    assert_near_f64(attend(q, k, v, mask, 2.0), want, formula(np.float64), 1, "softcapped attention")
    assert differs(attend(q, k, v, mask), want)
    cfg = BASE.replace(attn_softcap=0.05)
    params = tiny_params(cfg)
    assert differs(forward(cfg, params, TOKS), forward(BASE, params, TOKS))


@pytest.mark.numerics
def test_logit_softcap_bounds_the_logits():
    cfg = BASE.replace(logit_softcap=0.2, tie_embeddings=False)
    params = tiny_params(cfg)
    capped, raw = forward(cfg, params, TOKS), forward(cfg.replace(logit_softcap=None), params, TOKS)
    assert float(jnp.abs(capped).max()) < 0.2 < float(jnp.abs(raw).max())
    assert_fp32_close(capped, softcap(raw, 0.2), L, "softcap")


@pytest.mark.numerics
def test_relu2_mlp_is_down_of_squared_relu_of_up():
    cfg = BASE.replace(mlp="relu2")
    params = tiny_params(cfg)
    assert set(params["layers"]["mlp"]) == {"up_proj", "down_proj"}
    mlp = jax.tree.map(lambda a: a[0], params["layers"]["mlp"])
    x = jax.random.normal(jax.random.PRNGKey(4), (B, T, D))
    formula = lambda dtype: (
        np.maximum(np.asarray(x, dtype) @ np.asarray(mlp["up_proj"], dtype), 0.0) ** 2
        @ (np.asarray(mlp["down_proj"], dtype))
    )
    # the float64 rule (one MLP: depth 1), measured against the formula's own fp32 error: one fp32
    # evaluation is 3.9 u * scale from float64 (the up projection's sums cancel, the square doubles their
    # relative error), the depth rule's whole allowance for two
    want = formula(np.float32)
    assert_near_f64(MLPS["relu2"].apply(cfg, mlp, x, None)[0], want, formula(np.float64), 1, "relu2")
    np.testing.assert_array_equal(
        relu2(x, mlp["up_proj"], mlp["down_proj"]), MLPS["relu2"].apply(cfg, mlp, x, None)[0]
    )
    assert forward(cfg, params, TOKS).shape == (B, T, cfg.vocab_size)


@pytest.fixture
def scaled_identity_mlp():
    """A throwaway MLP registered by name, as MoE will be: no edit to the block or the table."""

    def specs(cfg):
        return {"scale": ParamSpec((cfg.num_layers,), ("layers",), ones, "scalar")}

    register_mlp("scaled_identity", specs, lambda cfg, p, x, state: (x * p["scale"], {}))
    yield "scaled_identity"
    del MLPS["scaled_identity"]
    MLP_NAMES.discard("scaled_identity")


def test_an_mlp_registers_by_name(scaled_identity_mlp):
    cfg = BASE.replace(mlp=scaled_identity_mlp)
    params = tiny_params(cfg)
    assert params["layers"]["mlp"]["scale"].shape == (L,)
    assert forward(cfg, params, TOKS).shape == (B, T, cfg.vocab_size)
    with pytest.raises(ValueError, match="^mlp "):
        BASE.replace(mlp="scaled_identity_typo")


# ---------------------------------------------------------------------------------------------
# The feedback hook, in the LRT's shape: memory m [B, T, D] into the residual stream before every block
# (x <- alpha x + beta x0 + gamma m) and into every layer's keys/values through learned projections.


def _lrt_params(key, scale=1.0):
    ks = jax.random.split(key, 5)
    return {
        "alpha": 1.0 + 0.1 * scale * jax.random.normal(ks[0], (L,)),
        "beta": 0.1 * scale * jax.random.normal(ks[1], (L,)),
        "gamma": scale * jax.random.normal(ks[2], (L,)),
        "k_fb": 0.2 * scale * jax.random.normal(ks[3], (L, D, K, E)),
        "v_fb": 0.2 * scale * jax.random.normal(ks[4], (L, D, K, E)),
    }


def _lrt_feedback(params, inputs, residual=True, kv=True):
    def residual_fn(p, inp, h):
        return p["alpha"] * h + p["beta"] * inp["x0"] + p["gamma"] * inp["m"]

    def kv_fn(p, inp, x, k, v):
        k = k + jnp.einsum("btd,dke->btke", inp["m"], p["k_fb"])
        return k, v + jnp.einsum("btd,dke->btke", inp["m"], p["v_fb"])

    return Feedback(params, inputs, residual_fn if residual else None, kv_fn if kv else None)


def _fb_forward(cfg, params, toks, fb_params, m, residual=True, kv=True):
    h = backbone.embed(cfg, params, toks)
    fb = _lrt_feedback(fb_params, {"m": m, "x0": h}, residual, kv)
    h = backbone.run_blocks(cfg, params, h, 0, cfg.num_layers, **LAYOUT, feedback=fb, tokens=toks).h
    return backbone.head(cfg, params, h)


fb_forward = jax.jit(_fb_forward, static_argnums=(0, 5, 6))
PARAMS = tiny_params(BASE)
MEMORY = jax.random.normal(jax.random.PRNGKey(7), (B, T, D))


def test_zero_feedback_equals_no_feedback():
    zero = jax.tree.map(jnp.zeros_like, _lrt_params(jax.random.PRNGKey(0)))
    zero["alpha"] = jnp.ones(L)
    np.testing.assert_array_equal(fb_forward(BASE, PARAMS, TOKS, zero, MEMORY), forward(BASE, PARAMS, TOKS))


@pytest.mark.parametrize("residual,kv", [(True, False), (False, True), (True, True)])
def test_feedback_reaches_only_its_position_and_later_ones(residual, kv):
    """Memory at slot j alone moves the logits at j and after it (through attention), never before."""
    j = 4
    fbp = _lrt_params(jax.random.PRNGKey(1))
    m = jnp.zeros((B, T, D)).at[:, j].set(MEMORY[:, j])
    base = fb_forward(BASE, PARAMS, TOKS, fbp, jnp.zeros((B, T, D)), residual, kv)
    moved = np.abs(fb_forward(BASE, PARAMS, TOKS, fbp, m, residual, kv) - base).max(axis=(0, 2))
    assert (moved[:j] == 0).all() and (moved[j:] > 1e-5).all()


def test_feedback_params_are_sliced_with_the_layer_range():
    """Only layer 2 feeds back: blocks [0, 2) are untouched, [0, 3) and [2, 3) are not."""
    fbp = jax.tree.map(jnp.zeros_like, _lrt_params(jax.random.PRNGKey(2)))
    fbp["alpha"] = jnp.ones(L)
    fbp["gamma"] = fbp["gamma"].at[2].set(1.0)
    h = backbone.embed(BASE, PARAMS, TOKS)
    mem = {"m": MEMORY, "x0": h}
    np.testing.assert_array_equal(
        run_blocks(BASE, PARAMS, h, 0, 2, fbp, mem, True), run_blocks(BASE, PARAMS, h, 0, 2)
    )
    for start in (0, 2):
        assert differs(
            run_blocks(BASE, PARAMS, h, start, 3, fbp, mem, True), run_blocks(BASE, PARAMS, h, start, 3)
        )


# ---------------------------------------------------------------------------------------------
# Everything at once, through the KV cache: a prefill chunk, then one token per step.

NANOCHAT = BASE.replace(
    **{**NANOCHAT_BLOCK, "sliding_window": 2},
    attn_softcap=3.0,
    logit_softcap=5.0,
    mlp="relu2",
    tie_embeddings=False,
    init_scheme="nanochat",
)
# karpathy/nanochat's own GPT adds smear (the cache keeps the last token for it) and backout.
KARPATHY = NANOCHAT.replace(
    smear_channels=8, backout=True, ve_gate_scale=3.0, init_scheme="nanochat_karpathy"
)
QWEN_LIKE = BASE.replace(qk_norm="before_rope", window_pattern="S", sliding_window=3, attn_softcap=2.0)
GEMMA_LIKE = BASE.replace(
    norm_offset=True,
    embed_scale=True,
    sandwich_norms=True,
    qk_norm="before_rope",
    mlp="geglu",
    query_pre_attn_scalar=24.0,
    window_pattern="SL",
    sliding_window=2,
    rope_local_theta=500.0,
    logit_softcap=5.0,
)


def _cached_step(cfg, params, fb_params, cache, toks, positions, m):
    h = backbone.embed(cfg, params, toks, cache)
    fb = _lrt_feedback(fb_params, {"m": m, "x0": h})
    out = backbone.run_blocks(
        cfg,
        params,
        h,
        0,
        cfg.num_layers,
        positions=positions,
        segment_ids=jnp.ones_like(toks),
        cache=cache,
        feedback=fb,
        tokens=toks,
    )
    return backbone.head(cfg, params, out.h), backbone.advance(out.cache, toks.shape[1])


cached_step = jax.jit(_cached_step, static_argnums=0)


# Gemma3 1B's layout in small: the pattern tiles over every layer, the last one sliding.
GEMMA_LAST_SLIDING = GEMMA_LIKE.replace(window_pattern="SSL", last_layer_full=False)


@pytest.mark.numerics
@pytest.mark.parametrize(
    "cfg",
    [NANOCHAT, KARPATHY, QWEN_LIKE, GEMMA_LIKE, GEMMA_LAST_SLIDING],
    ids=["nanochat", "karpathy_nanochat", "qwen_like", "gemma_like", "gemma_last_sliding"],
)
def test_cached_decoding_with_every_option_equals_the_parallel_forward(cfg):
    params = tiny_params(cfg, seed=1)
    if cfg.init_scheme != "normal" or cfg.norm_offset:  # zero-initialised weights would hide paths
        params = jax.tree.map(lambda x: x + 0.2 * jax.random.normal(jax.random.PRNGKey(8), x.shape), params)
    if "q_norm" in params["layers"]["self_attn"]:
        for name in ("q_norm", "k_norm"):
            params["layers"]["self_attn"][name] = 1.0 + jax.random.uniform(jax.random.PRNGKey(9), (L, E))
    fbp = _lrt_params(jax.random.PRNGKey(3), scale=0.5)
    want = fb_forward(cfg, params, TOKS, fbp, MEMORY, True, True)
    cache = backbone.init_cache(cfg, B, T)
    pos = LAYOUT["positions"]
    prefill = 4
    logits, cache = cached_step(
        cfg, params, fbp, cache, TOKS[:, :prefill], pos[:, :prefill], MEMORY[:, :prefill]
    )
    got = [logits]
    for t in range(prefill, T):
        logits, cache = cached_step(
            cfg, params, fbp, cache, TOKS[:, t : t + 1], pos[:, t : t + 1], MEMORY[:, t : t + 1]
        )
        got.append(logits)
    # The memory is an input (no chain through the tokens): the L layers' path (the two paths measured up to
    # 22.6 u * scale apart, gemma_like, native, on these perturbed weights).
    assert_fp32_close(jnp.concatenate(got, axis=1), want, L, "cached decoding")
    assert differs(want, forward(cfg, params, TOKS))  # the feedback is on


# ---------------------------------------------------------------------------------------------
# nanochat's parts: per-layer resid / x0 scalars, value embeddings on alternating layers, its init.


@pytest.mark.numerics
def test_smear_reads_the_caches_last_vocabulary_token():
    """Decoding, a token's smear mixes in the last vocabulary token the cache holds (a thought slot, LATENT,
    is skipped), as the row's token before it in a parallel pass; nothing at an empty cache."""
    cfg = KARPATHY
    params = jax.tree.map(lambda x: x + 0.2, tiny_params(cfg, seed=1))
    parallel = backbone.embed(cfg, params, TOKS[:, :2])
    cache = backbone.init_cache(cfg, B, 4)
    cache = cache._replace(tokens=cache.tokens.at[:, 0].set(TOKS[:, 0]), index=jnp.int32(2))  # slot 1: LATENT
    smeared = backbone.embed(cfg, params, TOKS[:, 1:2], cache)
    assert_fp32_close(smeared, parallel[:, 1:], 1, "smear")  # an embedding, no block
    fresh = backbone.init_cache(cfg, B, 4)
    np.testing.assert_array_equal(
        backbone.embed(cfg, params, TOKS[:, 1:2], fresh), backbone.embed(cfg, params, TOKS[:, 1:2])
    )
    assert differs(parallel[:, 1:], backbone.embed(cfg, params, TOKS[:, 1:2]))


def test_nanochat_init_scheme():
    specs = spec_leaves(param_specs(NANOCHAT))
    params = tiny_params(NANOCHAT)
    attn, mlp = params["layers"]["self_attn"], params["layers"]["mlp"]
    for zero in (attn["o_proj"], mlp["down_proj"], attn["ve_gate"]):
        assert not np.asarray(zero).any()
    assert 0.6 < float(jnp.std(params["embed_tokens"])) < 1.4
    assert float(jnp.std(params["lm_head"])) < 0.002
    bound = 3**0.5 * NANOCHAT.hidden_size**-0.5
    assert float(jnp.abs(attn["q_proj"]).max()) <= bound
    np.testing.assert_array_equal(params["resid_lambdas"], np.ones(L))
    np.testing.assert_allclose(params["x0_lambdas"], np.full(L, 0.1))  # 0.1 rounded once to fp32: < 1e-7
    assert specs[("resid_lambdas",)].kind == "residual" and specs[("x0_lambdas",)].kind == "skip"


def test_value_embeddings_sit_on_alternating_layers_ending_with_the_last():
    assert NANOCHAT.replace(num_layers=4).value_embed_layers == (1, 3)
    assert NANOCHAT.replace(num_layers=5).value_embed_layers == (0, 2, 4)
    cfg = NANOCHAT.replace(num_layers=4)
    params = tiny_params(cfg)
    assert params["value_embeds"].shape == (2, cfg.vocab_size, cfg.num_kv_heads, cfg.head_dim)
    params = jax.tree.map(lambda x: x + 0.2 * jax.random.normal(jax.random.PRNGKey(2), x.shape), params)
    h = backbone.embed(cfg, params, TOKS)
    run = lambda p, end: backbone.run_blocks(cfg, p, h, 0, end, **LAYOUT, tokens=TOKS).h
    # Layer 0 has no value embedding: its output ignores the table; layer 1's does not.
    moved = {**params, "value_embeds": params["value_embeds"] * 2.0}
    np.testing.assert_array_equal(run(moved, 1), run(params, 1))
    assert differs(run(moved, 2), run(params, 2))


@pytest.mark.numerics
def test_resid_scalars_at_one_and_zero_are_the_plain_residual_stream():
    cfg = NANOCHAT.replace(value_embeds=False)
    params = tiny_params(cfg, seed=3)
    params = jax.tree.map(lambda x: x + 0.2 * jax.random.normal(jax.random.PRNGKey(4), x.shape), params)
    plain = {k: v for k, v in params.items() if k not in ("resid_lambdas", "x0_lambdas")}
    neutral = {**params, "resid_lambdas": jnp.ones(L), "x0_lambdas": jnp.zeros(L)}
    assert_fp32_close(forward(cfg, neutral, TOKS), forward(cfg.replace(resid_scalars=False), plain, TOKS), L)
    assert differs(forward(cfg, params, TOKS), forward(cfg, neutral, TOKS))
    with pytest.raises(ValueError, match="resid_scalars needs the tokens"):
        backbone.run_blocks(cfg, params, backbone.embed(cfg, params, TOKS), 1, 2, **LAYOUT)
