"""The gate zoo and the cache update: shapes, dtypes, identity at γ = 0, the rescale's semantics. A formula
written out again in fp32 numpy is held to the depth rule of tests/tolerance.py at depth 1 (one op)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2mlr_jax.architectures.t2mlr import recurrent
from t2mlr_jax.architectures.t2mlr.fusion import fuse, gamma_stats, update_cache
from t2mlr_jax.architectures.t2mlr.mixers import MIXERS
from t2mlr_jax.model.params import init_params
from tests.tiny import tiny_config
from tests.tolerance import assert_fp32_close

IDENTITY_AT_INIT = {"gated", "gated_fixed", "none", "var_norm_gated", "alpha_coupled", "concat"}
B, T, D = 2, 5, 32


def streams(dtype=jnp.float32):
    kx, kr = jax.random.split(jax.random.PRNGKey(3))
    x = jax.random.normal(kx, (B, T, D)).astype(dtype)
    r = 3.0 * jax.random.normal(kr, (B, T, D)).astype(dtype)
    return x, r


def mixer_params(mixer, **rec):
    cfg = recurrent(tiny_config(), mixer=mixer, **rec)
    return cfg, init_params(cfg, jax.random.PRNGKey(0)).get("mixer", {})


@pytest.mark.parametrize("mixer", MIXERS.names())
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_every_mixer_shape_dtype_and_identity_at_init(mixer, dtype):
    cfg, p = mixer_params(mixer)
    x, r = streams(dtype)
    cf = jnp.full((B, T), 2)
    out, stats = fuse(cfg, p, x, r, cf)
    assert out.shape == x.shape and out.dtype == dtype
    assert all(v.shape == (B, T) for v in stats.values())
    for name, v in p.items():
        if name.startswith("rezero_gamma"):
            assert v.dtype == jnp.float32 and float(jnp.abs(v).max()) == 0.0
    if mixer in IDENTITY_AT_INIT:
        np.testing.assert_array_equal(out, x)
    else:
        assert float(jnp.abs(out.astype(jnp.float32) - x.astype(jnp.float32)).max()) > 1e-3


@pytest.mark.parametrize("mixer", ["gated", "var_norm_gated", "alpha_coupled"])
def test_gamma_switches_the_recurrent_stream_on(mixer):
    cfg, p = mixer_params(mixer, gamma_per_channel=True)
    p = {k: (jnp.full_like(v, 0.5) if k.startswith("rezero_gamma") else v) for k, v in p.items()}
    assert all(v.shape == (D,) for k, v in p.items() if k.startswith("rezero_gamma"))
    x, r = streams()
    out = fuse(cfg, p, x, r, jnp.full((B, T), 2))[0]
    assert float(jnp.abs(out - x).max()) > 1e-2
    # an analytic value: tanh(0.5) rounded in fp32, a few u = 6e-8
    assert all(abs(float(v) - np.tanh(0.5)) < 1e-6 for v in gamma_stats(cfg, p).values())


def test_only_recurrent_positions_are_fused():
    cfg, p = mixer_params("coconut")
    x, r = streams()
    cf = jnp.array([[0, 1, 2, 2, 1], [2, 2, 2, 0, 0]])
    out = fuse(cfg, p, x, r, cf)[0]
    keep = np.asarray(cf < 2)
    np.testing.assert_array_equal(np.asarray(out)[keep], np.asarray(x)[keep])
    assert np.abs(np.asarray(out - x)[~keep]).min() > 0


def test_pre_and_post_norm_bound_the_mixed_in_term():
    cfg, p = mixer_params("coconut", pre_norm=True, post_norm=True)
    x, r = streams()
    out = fuse(cfg, p, x, 1e3 * r, jnp.full((B, T), 2))[0]
    rms = np.sqrt(np.mean(np.asarray(out) ** 2, axis=-1))
    np.testing.assert_allclose(rms, 1.0, rtol=1e-3)  # the mix's structure, not round-off: far below 1e3x r


@pytest.mark.numerics
def test_cache_update_raw_residual_rescale_and_rmsnorm():
    x, r = streams()
    cf = jnp.array([[2, 2, 1, 0, 2]] * B)
    raw_cfg, p = mixer_params("gated", temporal_residual=False)
    np.testing.assert_array_equal(update_cache(raw_cfg, p, x, r, cf), x)

    cfg, p = mixer_params("gated")
    new = np.asarray(update_cache(cfg, p, x, r, cf))
    y = np.asarray(x + r)
    scale = np.clip(1 / np.sqrt(np.mean(y**2, -1, keepdims=True) + 1e-6), 1 / 5, 5)
    rec = np.asarray(cf == 2)
    assert_fp32_close(new[rec], (y * scale)[rec], 1, "rescale")
    np.testing.assert_array_equal(new[~rec], np.asarray(x)[~rec])  # non-recurrent: raw h^(l_end)
    # The clamp: a tiny stream is scaled up by at most 5.
    tiny = np.asarray(update_cache(cfg, p, 1e-3 * x, 0 * r, jnp.full((B, T), 2)))
    assert_fp32_close(tiny, 5e-3 * np.asarray(x), 1, "clamp")
    # The scale is a stop_gradient: d(sum R)/dh is the (constant) scale itself.
    g = jax.grad(lambda h: update_cache(cfg, p, h, r, jnp.full((B, T), 2)).sum())(x)
    assert_fp32_close(np.asarray(g), np.broadcast_to(scale, g.shape), 2, "gradient")  # one op, there and back

    rms_cfg, p = mixer_params("gated", cache_norm="rmsnorm")
    assert p["cache_norm"].shape == (D,)
    normed = np.asarray(update_cache(rms_cfg, p, x, r, jnp.full((B, T), 2)))
    np.testing.assert_allclose(np.sqrt(np.mean(normed**2, -1)), 1.0, rtol=1e-4)  # unit RMS; its eps: 1e-6


def test_detached_temporal_residual_blocks_the_gradient_to_the_previous_cache():
    x, r = streams()
    cf = jnp.full((B, T), 2)
    for detach, expect_zero in ((True, True), (False, False)):
        cfg, p = mixer_params("gated", temporal_residual_detach=detach)
        g = jax.grad(lambda rr: update_cache(cfg, p, x, rr, cf).sum())(r)
        assert (float(jnp.abs(g).max()) == 0.0) == expect_zero


def test_gate_init_follows_the_release():
    cfg, p = mixer_params("gated", recurrent_gate_init=0.2, input_gate_init=0.8, gate_weight_init_std=1e-2)
    # init constants: logit(p) rounded to fp32 and back through an fp32 sigmoid, a few u
    np.testing.assert_allclose(jax.nn.sigmoid(p["recurrent_gate_proj"]["bias"]), 0.2, rtol=1e-5)
    np.testing.assert_allclose(jax.nn.sigmoid(p["input_gate_proj"]["bias"]), 0.8, rtol=1e-5)
    std = float(p["recurrent_gate_proj"]["kernel"].std())
    assert abs(std - 1e-2 * np.sqrt(2 / (3 * D))) < 0.2 * 1e-2 * np.sqrt(2 / (3 * D))  # a sample's std: 20%
    assert p["recurrent_projection"].shape == (D, D)
    _, no_proj = mixer_params("gated", recurrent_projection=False)
    assert "recurrent_projection" not in no_proj


def test_unset_gate_inits_follow_each_release_module():
    """var_norm_gated falls back to the release's logit(0.2) bias; alpha_coupled and gated stay random."""
    _, p = mixer_params("var_norm_gated")
    # init constants: logit(p) rounded to fp32 and back through an fp32 sigmoid, a few u
    np.testing.assert_allclose(jax.nn.sigmoid(p["alpha_gate_proj"]["bias"]), 0.2, rtol=1e-5)
    _, p = mixer_params("var_norm_gated", recurrent_gate_init=0.7)
    np.testing.assert_allclose(jax.nn.sigmoid(p["alpha_gate_proj"]["bias"]), 0.7, rtol=1e-5)
    _, p = mixer_params("alpha_coupled")
    assert float(jnp.std(p["alpha_gate_proj"]["bias"])) > 1e-3


def test_codi_bottleneck_size_sets_its_hidden_width():
    cfg, p = mixer_params("codi", bottleneck_size=12)
    assert p["codi_projection"]["fc1"]["kernel"].shape == (D, 12)
    assert p["codi_projection"]["fc2"]["kernel"].shape == (12, D)
    x, r = streams()
    assert fuse(cfg, p, x, r, jnp.full((B, T), 2))[0].shape == x.shape
    assert mixer_params("codi")[1]["codi_projection"]["fc1"]["kernel"].shape == (D, D)
    with pytest.raises(ValueError, match="bottleneck_size"):
        recurrent(tiny_config(), mixer="codi", bottleneck_size=0)
