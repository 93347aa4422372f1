"""The backbone: RoPE layout, remat, untied head, NoPE, and runtime shape checking."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2mlr_jax.model import backbone
from t2mlr_jax.model.layers import rope
from tests.tiny import rel_err, tiny_config, tiny_params, tokens


def test_rope_is_hf_rotate_half():
    """Pairs (i, i + E/2) rotate by position * theta^(-2i/E), as HF's rotate_half does."""
    e, theta = 8, 100.0
    x = jax.random.normal(jax.random.PRNGKey(0), (1, 3, 2, e))
    pos = jnp.array([[0, 1, 5]])
    out = np.asarray(rope(x, pos, theta))
    freq = theta ** (-np.arange(e // 2) * 2.0 / e)
    ang = np.asarray(pos)[..., None, None] * freq
    z = (np.asarray(x[..., : e // 2]) + 1j * np.asarray(x[..., e // 2 :])) * np.exp(1j * ang)
    np.testing.assert_allclose(out, np.concatenate([z.real, z.imag], -1), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(rope(x, pos, None), x)  # NoPE


@pytest.mark.parametrize("remat", ["full", "dots"])
def test_remat_changes_nothing_but_memory(remat):
    cfg = tiny_config(recurrence=None)
    params = tiny_params(cfg)
    toks = tokens(2, 8)
    loss = lambda c: jax.value_and_grad(lambda p: backbone.forward(c, p, toks).std())(params)
    (v0, g0), (v1, g1) = loss(cfg), loss(cfg.replace(remat=remat))
    assert abs(float(v0 - v1)) < 1e-6
    assert max(rel_err(a, b) for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0))) < 1e-5


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
