"""T²MLR's three modes agree with each other, with the plain backbone at γ = 0, and with the release's D/B
semantics on gradients (the gradient reaches back through exactly the last B refinement passes).

Bounds (tests/tolerance.py): Jacobi and cached decoding are held to the float64 rule against the naive
float64 recurrence (tests/reference.py), measured against the exact recurrence's own fp32 error; the other
fp32 pairs (γ = 0 against the backbone, gradients, packed rows against rows alone) to the depth rule, the
depth counted by `recurrence_layers` (t2mlr_jax/studies/parity.py): the recurrence's window once per
token (a Jacobi pass counts as a token), a gradient twice its forward."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2mlr_jax.architectures.t2mlr import recurrent
from t2mlr_jax.architectures.t2mlr.fusion import fuse, update_cache
from t2mlr_jax.architectures.t2mlr.recurrence import decode_step
from t2mlr_jax.model import backbone
from t2mlr_jax.model.backbone import init_cache
from t2mlr_jax.model.token_layout import Layout, make_layout, shift_right
from t2mlr_jax.studies.parity import recurrence_layers
from tests import reference
from tests.tiny import NANOCHAT_BLOCK, exact, jacobi, plain, rel_err, tiny_config, tiny_params, tokens
from tests.tolerance import assert_fp32_close, assert_near_f64

T = 12
CFG = tiny_config()
_decode_step = jax.jit(decode_step, static_argnums=0)


def truth(cfg, params, toks, layout=None):
    """The float64 logits of the naive recurrence (tests/reference.py)."""
    return reference.t2mlr(cfg, reference.f64(params), toks, layout or make_layout(toks))


def decode_logits(cfg, params, toks, layout=None):
    """Token-by-token decoding with the KV cache, one jitted step per token."""
    layout = layout or make_layout(toks)
    b, t = toks.shape
    cache, r, logits = init_cache(cfg, b, t), jnp.zeros((b, cfg.hidden_size)), []
    for i in range(t):
        out = _decode_step(
            cfg, params, toks[:, i : i + 1], r, cache, Layout(*(a[:, i : i + 1] for a in layout))
        )
        r, cache = out.recurrent_state, out.cache
        logits.append(out.logits)
    return jnp.concatenate(logits, axis=1)


@pytest.mark.numerics
@pytest.mark.parametrize("l_range", [(1, 2), (0, 3), (2, 2)])
def test_fresh_init_equals_backbone_in_every_mode(l_range):
    cfg = recurrent(tiny_config(), l_start=l_range[0], l_end=l_range[1])
    params = tiny_params(cfg)
    toks = tokens(2, T)
    ref = plain(cfg, params, toks)
    depth = cfg.num_layers  # γ = 0: the fusion adds exact zeros, no path runs through R
    assert_fp32_close(jacobi(cfg, params, toks, d_forward=4, d_backward=2).logits, ref, depth, "jacobi")
    assert_fp32_close(exact(cfg, params, toks).logits, ref, depth, "exact")
    assert_fp32_close(decode_logits(cfg, params, toks), ref, depth, "decode")


@pytest.mark.slow
@pytest.mark.numerics
@pytest.mark.parametrize("l_range", [(1, 2), (0, -1), (2, 2)])
def test_jacobi_with_enough_passes_equals_exact_equals_decode(l_range):
    cfg = recurrent(tiny_config(), l_start=l_range[0], l_end=l_range[1])
    params = tiny_params(cfg, gamma=0.8)
    toks = tokens(2, T)
    want, f64, depth = exact(cfg, params, toks), truth(cfg, params, toks), recurrence_layers(cfg, T)
    got = jacobi(cfg, params, toks, d_forward=T, d_backward=2)
    assert_near_f64(got.logits, want.logits, f64, depth, "jacobi")
    assert_near_f64(decode_logits(cfg, params, toks), want.logits, f64, depth, "decode")
    _, l_end = cfg.layer_range  # R_T: the path stops after the last token's block l_end
    assert_fp32_close(got.recurrent_state, want.recurrent_state, depth - (cfg.num_layers - 1 - l_end), "R")
    # The recurrence really is on: the plain backbone gives different logits.
    assert rel_err(plain(cfg, params, toks), want.logits) > 1e-2


NANOCHAT_PARTS = dict(NANOCHAT_BLOCK, mlp="relu2", tie_embeddings=False, logit_softcap=15.0)


@pytest.mark.slow
@pytest.mark.numerics
@pytest.mark.parametrize("l_range", [(0, -1), (1, 2)])
def test_t2mlr_on_nanochat_blocks_modes_agree(l_range):
    """x0 and the value embeddings come from the tokens in every block range, also the fused one."""
    cfg = recurrent(tiny_config(**NANOCHAT_PARTS), l_start=l_range[0], l_end=l_range[1])
    params = tiny_params(cfg, gamma=0.8)
    toks = tokens(2, T)
    want, f64, depth = exact(cfg, params, toks).logits, truth(cfg, params, toks), recurrence_layers(cfg, T)
    assert_near_f64(jacobi(cfg, params, toks, d_forward=T, d_backward=2).logits, want, f64, depth, "jacobi")
    assert_near_f64(decode_logits(cfg, params, toks), want, f64, depth, "decode")
    backbone_logits = plain(cfg, tiny_params(cfg), toks)  # γ = 0: the backbone
    assert_fp32_close(exact(cfg, tiny_params(cfg), toks).logits, backbone_logits, cfg.num_layers, "γ = 0")


@pytest.mark.numerics
def test_few_jacobi_passes_are_exact_only_before_position_d():
    params = tiny_params(CFG, gamma=0.8)
    toks = tokens(2, T)
    want = exact(CFG, params, toks).logits
    d = 4
    got = jacobi(CFG, params, toks, d_forward=d, d_backward=1).logits
    # positions t < d: d passes reach as deep as the recurrence over d tokens
    scale = float(np.abs(want).max())  # the largest logit, as the positions after D are measured
    assert_fp32_close(got[:, :d], want[:, :d], recurrence_layers(CFG, d), "positions < D", scale=scale)
    per_position = np.abs(np.asarray(got - want)).max(axis=(0, 2)) / np.abs(want).max()
    assert per_position[d:].min() > 1e-4  # the later ones are not yet the recurrence


def ce_loss(logits, toks):
    targets = jnp.roll(toks, -1, axis=1)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], axis=-1))


def ce_grad(logits_of, params, toks):
    """The jitted gradient at `params` of the next-token loss of `logits_of(params)`."""
    return jax.jit(jax.grad(lambda p: ce_loss(logits_of(p), toks)))(params)


@pytest.mark.slow
@pytest.mark.numerics
def test_jacobi_full_gradient_equals_exact_full_bptt():
    params = tiny_params(CFG, gamma=0.8)
    toks = tokens(2, 8)
    g_jacobi = ce_grad(lambda p: jacobi(CFG, p, toks, d_forward=8, d_backward=8).logits, params, toks)
    g_exact = ce_grad(lambda p: exact(CFG, p, toks).logits, params, toks)
    depth = 2 * recurrence_layers(CFG, 8)  # forward and back
    for path, a in jax.tree_util.tree_leaves_with_path(g_jacobi):  # each leaf at its own scale
        assert_fp32_close(a, _get(g_exact, path), depth, jax.tree_util.keystr(path))


def _get(tree, path):
    for k in path:
        tree = tree[k.key]
    return tree


def reference_jacobi(cfg, params, toks, d, b):
    """The spec's algorithm, literally, as a Python loop: detach M when (D-1-i) > B; R<1> when B < D."""
    layout = make_layout(toks)
    l_start, l_end = cfg.layer_range
    kw = dict(positions=layout.positions, segment_ids=layout.segment_ids)
    x = backbone.run_blocks(cfg, params, backbone.embed(cfg, params, toks), 0, l_start, **kw).h
    middle = lambda h: backbone.run_blocks(cfg, params, h, l_start, l_end + 1, **kw).h
    r = shift_right(middle(x), layout.positions)
    if b < d:
        r = jax.lax.stop_gradient(r)
    for i in range(d - 1):
        m = update_cache(
            cfg,
            params["mixer"],
            middle(fuse(cfg, params["mixer"], x, r, layout.control_flow)[0]),
            r,
            layout.control_flow,
        )
        if d - 1 - i > b:
            m = jax.lax.stop_gradient(m)
        r = shift_right(m, layout.positions)
    h = middle(fuse(cfg, params["mixer"], x, r, layout.control_flow)[0])
    h = backbone.run_blocks(cfg, params, h, l_end + 1, cfg.num_layers, **kw).h
    return backbone.head(cfg, params, h)


@pytest.mark.slow
@pytest.mark.numerics
@pytest.mark.parametrize("d,b", [(4, 0), (4, 2), (4, 4), (3, 5), (1, 0), (1, 3)])
def test_gradient_truncation_matches_the_spec(d, b):
    params = tiny_params(CFG, gamma=0.8)
    toks = tokens(2, 8)
    g = ce_grad(lambda p: jacobi(CFG, p, toks, d_forward=d, d_backward=b).logits, params, toks)
    g_ref = ce_grad(lambda p: reference_jacobi(CFG, p, toks, d, b), params, toks)
    depth = 2 * recurrence_layers(CFG, d)  # D passes forward, and back
    for path, a in jax.tree_util.tree_leaves_with_path(g):  # each leaf at its own scale
        assert_fp32_close(a, _get(g_ref, path), depth, jax.tree_util.keystr(path))


@pytest.mark.slow
@pytest.mark.numerics
def test_b0_lower_layers_get_gradient_only_through_the_final_pass():
    """With B = 0 every refinement pass is detached: the final pass on stop_gradient(R<D>) is the graph."""
    params = tiny_params(CFG, gamma=0.8)
    toks = tokens(2, 8)
    layout = make_layout(toks)
    r_d = jax.lax.stop_gradient(
        shift_right(jax.jit(_cache_after, static_argnums=(0, 3))(CFG, params, toks, 4), layout.positions)
    )

    def final_pass_only(p):
        kw = dict(positions=layout.positions, segment_ids=layout.segment_ids)
        x = backbone.run_blocks(CFG, p, backbone.embed(CFG, p, toks), 0, 1, **kw).h
        h = backbone.run_blocks(CFG, p, fuse(CFG, p["mixer"], x, r_d, layout.control_flow)[0], 1, 4, **kw).h
        return backbone.head(CFG, p, h)

    g = ce_grad(lambda p: jacobi(CFG, p, toks, d_forward=4, d_backward=0).logits, params, toks)
    g_ref = ce_grad(final_pass_only, params, toks)
    lower = lambda t: jax.tree.map(lambda a: a[:1], t["layers"])
    depth = 2 * recurrence_layers(
        CFG, 4
    )  # R<D> after 4 passes, then forward and back (each leaf at its own scale)
    for path, a in jax.tree_util.tree_leaves_with_path(lower(g)):
        assert_fp32_close(a, _get(lower(g_ref), path), depth, jax.tree_util.keystr(path))
    assert max(float(np.abs(a).max()) for a in jax.tree.leaves(lower(g))) > 0


def _cache_after(cfg, params, toks, d):
    """M of the (d-1)-th refinement pass, i.e. the values R<d> is shifted from."""
    layout = make_layout(toks)
    kw = dict(positions=layout.positions, segment_ids=layout.segment_ids)
    x = backbone.run_blocks(cfg, params, backbone.embed(cfg, params, toks), 0, 1, **kw).h
    m = backbone.run_blocks(cfg, params, x, 1, 3, **kw).h
    for _ in range(d - 1):
        r = shift_right(m, layout.positions)
        h = backbone.run_blocks(
            cfg, params, fuse(cfg, params["mixer"], x, r, layout.control_flow)[0], 1, 3, **kw
        )[0]
        m = update_cache(cfg, params["mixer"], h, r, layout.control_flow)
    return m


@pytest.mark.slow
@pytest.mark.numerics
@pytest.mark.parametrize("bptt", [0, 2])
def test_exact_truncated_bptt_equals_jacobi_gradient(bptt):
    params = tiny_params(CFG, gamma=0.8)
    toks = tokens(2, 6)
    g_exact = ce_grad(lambda p: exact(CFG, p, toks, bptt=bptt).logits, params, toks)
    g_jacobi = ce_grad(lambda p: jacobi(CFG, p, toks, d_forward=6, d_backward=bptt).logits, params, toks)
    depth = 2 * recurrence_layers(CFG, 6)  # forward and back
    for path, a in jax.tree_util.tree_leaves_with_path(g_exact):  # each leaf at its own scale
        assert_fp32_close(a, _get(g_jacobi, path), depth, jax.tree_util.keystr(path))
    values = exact(CFG, params, toks, bptt=bptt).logits
    assert_fp32_close(values, exact(CFG, params, toks).logits, recurrence_layers(CFG, 6), "values")


def packed_and_alone(cfg, params, forward, lengths=(5, 3, 4)):
    """Logits of one packed row vs each document run alone."""
    docs = [tokens(1, n, seed=10 + i) for i, n in enumerate(lengths)]
    packed = jnp.concatenate(docs, axis=1)
    positions = jnp.concatenate([jnp.arange(n) for n in lengths])[None]
    segments = jnp.concatenate([jnp.full(n, i + 1) for i, n in enumerate(lengths)])[None]
    logits = forward(cfg, params, packed, make_layout(packed, positions, segments))
    alone = jnp.concatenate([forward(cfg, params, d, make_layout(d)) for d in docs], axis=1)
    return logits, alone


@pytest.mark.slow
@pytest.mark.numerics
@pytest.mark.parametrize("mode", ["jacobi", "exact", "decode", "backbone"])
def test_packed_documents_equal_documents_alone(mode):
    forward = {
        "jacobi": lambda c, p, t, lay: jacobi(c, p, t, layout=lay, d_forward=12, d_backward=0).logits,
        "exact": lambda c, p, t, lay: exact(c, p, t, layout=lay).logits,
        "decode": decode_logits,
        "backbone": lambda c, p, t, lay: plain(c, p, t, positions=lay.positions, segment_ids=lay.segment_ids),
    }[mode]
    params = tiny_params(CFG, gamma=0.8)
    logits, alone = packed_and_alone(CFG, params, forward)
    depth = (
        CFG.num_layers if mode == "backbone" else recurrence_layers(CFG, 5)
    )  # the longest document: 5 tokens
    assert_fp32_close(logits, alone, depth, "packed")


@pytest.mark.slow
@pytest.mark.numerics
def test_mixed_control_flow_rows_behave_as_if_alone():
    """Rows with prompt (1) / recurrent (2) / padding (0) spans: exact, Jacobi and row-alone agree."""
    params = tiny_params(CFG, gamma=0.8)
    toks = tokens(3, 8)
    cf = jnp.array([[2] * 8, [1, 1, 1, 2, 2, 2, 2, 2], [0, 0, 1, 1, 2, 2, 2, 2]])
    seg = (cf > 0).astype(jnp.int32)
    pos = jnp.maximum(jnp.cumsum(seg, axis=1) - 1, 0)
    layout = make_layout(toks, pos, seg, cf)
    want = exact(CFG, params, toks, layout=layout).logits
    got = jacobi(CFG, params, toks, layout=layout, d_forward=8, d_backward=0).logits
    real, depth = np.asarray(seg, bool), recurrence_layers(CFG, 8)
    assert_fp32_close(np.asarray(got)[real], np.asarray(want)[real], depth, "jacobi")
    for i in range(3):
        n = int(seg[i].sum())
        row = exact(
            CFG,
            params,
            toks[i : i + 1, -n:],
            layout=make_layout(toks[i : i + 1, -n:], control_flow=cf[i : i + 1, -n:]),
        ).logits
        assert_fp32_close(want[i : i + 1, -n:], row, depth, f"row {i} alone")


@pytest.mark.numerics
def test_plain_transformer_runs_through_every_mode():
    cfg = tiny_config(recurrence=None)
    params = tiny_params(cfg)
    toks = tokens(2, T)
    ref = plain(cfg, params, toks)
    depth = cfg.num_layers  # no recurrence
    assert_fp32_close(jacobi(cfg, params, toks).logits, ref, depth, "jacobi")
    assert_fp32_close(exact(cfg, params, toks).logits, ref, depth, "exact")
    assert_fp32_close(decode_logits(cfg, params, toks), ref, depth, "decode")


def test_bfloat16_compute_stays_near_float32_in_jacobi_and_exact():
    """bf16 compute on fp32 weights (the accelerator default): each mode within 2% of its fp32 logits
    (relative to the largest; measured ~0.5%, and not 0: bf16 is really used), and Jacobi with D >= T
    still equals exact at bf16 precision. (bf16 bounds, not fp32's: 2^-8 relative per rounding, the 2%
    the measured 0.5% with 4x room.)"""
    cfg = recurrent(tiny_config(), l_start=1, l_end=2)
    params = tiny_params(cfg, gamma=0.8)
    toks = tokens(2, T)
    bf16 = cfg.replace(dtype="bfloat16")
    for forward in (
        lambda c: jacobi(c, params, toks, d_forward=T, d_backward=2),
        lambda c: exact(c, params, toks),
    ):
        low, ref = forward(bf16).logits, forward(cfg).logits
        assert low.dtype == jnp.float32  # logits are accumulated in fp32
        assert 0 < rel_err(low, ref) <= 2e-2, rel_err(low, ref)
    got = jacobi(bf16, params, toks, d_forward=T, d_backward=2).logits
    assert rel_err(got, exact(bf16, params, toks).logits) <= 2e-2
