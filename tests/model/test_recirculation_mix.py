"""Recirculation's parameter-free mix: alpha = 0 is the identity bit for bit in every scheme (the
unmodified model), and each scheme has the geometry its name promises. The adaptive variant's MLP: two
GELU hidden layers over [z_src; z_dest], per-channel alpha, beta through a sigmoid, starting at 0.1 / 0.9.
A geometric fact (a norm kept, a direction taken) is held to the depth rule of tests/tolerance.py at depth
1 (one mix; the adaptive MLP: its 3 layers), against the same formula in numpy or in float64."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2mlr_jax.architectures.recirculation.mix import SCHEMES, adaptive_mix, adaptive_specs, check_mix, mix
from t2mlr_jax.model.spec import init_from_specs
from tests.tolerance import assert_fp32_close

D_SRC = jax.random.normal(jax.random.key(0), (2, 12, 16)) * 3.0
D_DEST = jax.random.normal(jax.random.key(1), (2, 12, 16))


def norm(z):
    return np.linalg.norm(np.asarray(z, np.float64), axis=-1)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_alpha_zero_is_the_identity_bit_for_bit(scheme, dtype):
    dest, src = D_DEST.astype(dtype), D_SRC.astype(dtype)
    positions = jnp.broadcast_to(jnp.arange(12), (2, 12))
    for ramp in (None, positions):
        out = mix(dest, src, 0.0, scheme=scheme, positions=ramp)
        assert out.dtype == dtype and bool(jnp.all(out == dest))
    zero_src = mix(dest, jnp.zeros_like(src), 0.3, scheme=scheme)  # a zero source never makes NaN
    assert bool(jnp.all(jnp.isfinite(zero_src)))


@pytest.mark.numerics
def test_each_scheme_has_its_geometry():
    d, s, a = D_DEST, D_SRC, 0.3
    assert_fp32_close(mix(d, s, 1.0, scheme="none"), s, 1, "none")
    ratio_full = mix(d, s, 1.0, scheme="ratio")  # the source's direction at the destination's norm
    assert_fp32_close(norm(ratio_full), norm(d), 1, "ratio's norm")
    direction = lambda z: z / norm(z)[..., None]
    assert_fp32_close(direction(ratio_full), direction(s), 1, "ratio's direction")
    assert_fp32_close(mix(d, s, a, scheme="nonconvex"), d + a * ratio_full, 1, "nonconvex")
    assert_fp32_close(norm(mix(d, s, a, scheme="renorm")), norm(d), 1, "renorm's norm")
    added = np.asarray(mix(d, s, a, scheme="orthogonal") - d, np.float64)
    # orthogonal: the dot product of `added` with d is a cancellation of terms up to a |d|^2 (|scaled| = |d|)
    assert_fp32_close(np.sum(added * np.asarray(d), -1), 0.0, 1, "orthogonal", scale=a * norm(d).max() ** 2)
    slerp = mix(d, s, a, scheme="slerp")
    assert_fp32_close(norm(slerp), norm(d), 1, "slerp's norm")
    assert_fp32_close(mix(d, s, 1.0, scheme="slerp"), ratio_full, 1, "slerp at 1")
    angle = lambda x, y: np.arccos(np.sum(x * y, -1) / (norm(x) * norm(y)))
    # angles through arccos, whose slope 1 / sin grows without bound near 0 and pi: a fixed bound
    np.testing.assert_allclose(
        angle(np.asarray(slerp), np.asarray(d)), a * angle(np.asarray(s), np.asarray(d)), atol=1e-3
    )
    # parallel directions: cos = 1 - eps gives theta ~ sqrt(2 eps) ~ 5e-4 from round-off alone (the code's
    # fallback catches sin < 1e-6), so a fixed bound that a NaN or a wrong branch fails
    assert float(jnp.max(jnp.abs(mix(d, d * 2.0, a, scheme="slerp") - d))) < 1e-5


@pytest.mark.numerics
def test_the_ramp_opens_over_the_first_ten_positions():
    positions = jnp.broadcast_to(jnp.arange(12), (2, 12))
    ramped = mix(D_DEST, D_SRC, 0.2, scheme="ratio", positions=positions)
    assert bool(jnp.all(ramped[:, 0] == D_DEST[:, 0]))
    assert_fp32_close(ramped[:, 10:], mix(D_DEST, D_SRC, 0.2, scheme="ratio")[:, 10:], 1, "ramp open")
    assert_fp32_close(ramped[:, 5], mix(D_DEST, D_SRC, 0.1, scheme="ratio")[:, 5], 1, "ramp half")


@pytest.mark.parametrize(
    "scheme, alpha, message",
    [
        ("cosine", 0.1, "must be one of"),
        ("ratio", 1.5, "(0, 1]"),
        ("slerp", 0.0, "(0, 1]"),
        ("nonconvex", -0.1, ">= 0"),
    ],
)
def test_bad_settings_are_one_clear_error(scheme, alpha, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        check_mix(scheme, alpha)


def _gelu(x):  # GELU, tanh form (jax.nn.gelu's default), written out
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


@pytest.mark.numerics
def test_adaptive_mlp_is_two_gelu_layers_giving_per_channel_alpha_and_beta():
    d, width = D_DEST.shape[-1], 24
    specs = adaptive_specs(d, width)
    shapes = {name: (layer["kernel"].shape, layer["bias"].shape) for name, layer in specs.items()}
    assert shapes == {  # [z_src; z_dest] -> width -> width -> [alpha; beta], one of each per channel
        "fc1": ((2 * d, width), (width,)),
        "fc2": ((width, width), (width,)),
        "out": ((width, 2 * d), (2 * d,)),
    }
    dest, src = np.asarray(D_DEST, np.float64), np.asarray(D_SRC, np.float64)
    scaled = src * norm(dest)[..., None] / norm(src)[..., None]  # ratio's f(z_src)

    mix_fn = jax.jit(adaptive_mix)
    mlp = jax.jit(lambda key: init_from_specs(specs, key, "float32"))(jax.random.key(2))
    # At initialisation: alpha 0.1, beta 0.9 in every channel.
    np.testing.assert_array_equal(mlp["out"]["kernel"], 0.0)
    gates = 1 / (1 + np.exp(-np.asarray(mlp["out"]["bias"], np.float64)))
    np.testing.assert_allclose(gates, np.repeat([0.1, 0.9], d), rtol=1e-6)  # logit(p) rounded to fp32: ~u
    out = mix_fn(mlp, D_DEST, D_SRC)
    assert_fp32_close(out, 0.1 * scaled + 0.9 * dest, 1, "at init")  # one mix, against float64

    # Trained (random) weights: a numpy reference of the MLP on RMS-normalised inputs.
    rng = np.random.default_rng(0)
    w = jax.tree.map(lambda a: np.asarray(a, np.float64) + 0.3 * rng.standard_normal(a.shape), mlp)
    rms = lambda z: z / np.sqrt(np.mean(z * z, -1, keepdims=True) + 1e-6)
    x = np.concatenate([rms(src), rms(dest)], -1)
    for name in ("fc1", "fc2"):
        x = _gelu(x @ w[name]["kernel"] + w[name]["bias"])
    gates = 1 / (1 + np.exp(-(x @ w["out"]["kernel"] + w["out"]["bias"])))
    alpha, beta = gates[..., :d], gates[..., d:]
    assert alpha.std(-1).min() > 1e-3 and beta.std(-1).min() > 1e-3  # per channel, not one per token
    out = mix_fn(jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), w), D_DEST, D_SRC)
    assert_fp32_close(out, alpha * scaled + beta * dest, 3, "trained")  # the MLP's 3 layers, against float64
