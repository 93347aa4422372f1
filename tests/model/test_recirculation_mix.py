"""Recirculation's parameter-free mix: alpha = 0 is the identity bit for bit in every scheme (the
unmodified model), and each scheme has the geometry its name promises."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2mlr_jax.model.recirculation_mix import SCHEMES, check_mix, mix

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


def test_each_scheme_has_its_geometry():
    d, s, a = D_DEST, D_SRC, 0.3
    np.testing.assert_allclose(mix(d, s, 1.0, scheme="none"), s, rtol=1e-6)
    ratio_full = mix(d, s, 1.0, scheme="ratio")  # the source's direction at the destination's norm
    np.testing.assert_allclose(norm(ratio_full), norm(d), rtol=1e-5)
    np.testing.assert_allclose(ratio_full / norm(ratio_full)[..., None], s / norm(s)[..., None], atol=1e-5)
    np.testing.assert_allclose(mix(d, s, a, scheme="nonconvex"), d + a * ratio_full, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(norm(mix(d, s, a, scheme="renorm")), norm(d), rtol=1e-5)
    added = np.asarray(mix(d, s, a, scheme="orthogonal") - d)
    np.testing.assert_allclose(np.sum(added * np.asarray(d), -1), 0.0, atol=1e-4)
    slerp = mix(d, s, a, scheme="slerp")
    np.testing.assert_allclose(norm(slerp), norm(d), rtol=1e-5)
    np.testing.assert_allclose(mix(d, s, 1.0, scheme="slerp"), ratio_full, rtol=1e-4, atol=1e-4)
    angle = lambda x, y: np.arccos(np.sum(x * y, -1) / (norm(x) * norm(y)))
    np.testing.assert_allclose(
        angle(np.asarray(slerp), np.asarray(d)), a * angle(np.asarray(s), np.asarray(d)), atol=1e-3
    )
    assert float(jnp.max(jnp.abs(mix(d, d * 2.0, a, scheme="slerp") - d))) < 1e-5  # parallel: no NaN


def test_the_ramp_opens_over_the_first_ten_positions():
    positions = jnp.broadcast_to(jnp.arange(12), (2, 12))
    ramped = mix(D_DEST, D_SRC, 0.2, scheme="ratio", positions=positions)
    assert bool(jnp.all(ramped[:, 0] == D_DEST[:, 0]))
    np.testing.assert_allclose(ramped[:, 10:], mix(D_DEST, D_SRC, 0.2, scheme="ratio")[:, 10:], rtol=1e-6)
    np.testing.assert_allclose(
        ramped[:, 5], mix(D_DEST, D_SRC, 0.1, scheme="ratio")[:, 5], rtol=1e-5, atol=1e-6
    )


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
