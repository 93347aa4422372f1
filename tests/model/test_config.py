"""Configuration checks fail early with a message naming the field; presets have the published shapes."""

import jax
import pytest

from t2mlr_jax.architectures.t2mlr import recurrent
from t2mlr_jax.architectures.t2mlr.recurrence import jacobi_forward
from t2mlr_jax.model import presets
from t2mlr_jax.model.params import init_params, param_axes
from t2mlr_jax.model.spec import count_params, matched_width
from tests.tiny import tiny_config, tiny_params, tokens


@pytest.mark.parametrize(
    "changes,field",
    [
        (dict(l_start=4), "l_start"),
        (dict(l_start=-1), "l_start"),
        (dict(l_start=2, l_end=1), "l_end"),
        (dict(l_end=7), "l_end"),
        (dict(d_forward=0), "d_forward"),
        (dict(d_backward=-1), "d_backward"),
        (dict(mixer="attention"), "mixer"),
        (dict(cache_norm="layernorm"), "cache_norm"),
    ],
)
def test_bad_recurrence_raises_naming_the_field(changes, field):
    with pytest.raises(ValueError, match=field):
        recurrent(tiny_config(), **changes)


@pytest.mark.parametrize(
    "changes,field",
    [
        (dict(num_kv_heads=3), "num_heads"),
        (dict(hidden_size=0), "hidden_size"),
        (dict(remat="sometimes"), "remat"),
        (dict(dtype="float8"), "dtype"),
        (dict(head_dim=7), "rope_theta"),
    ],
)
def test_bad_backbone_raises_naming_the_field(changes, field):
    with pytest.raises(ValueError, match=field):
        tiny_config(recurrence=None).replace(**changes)


def test_bad_jacobi_depths_raise_before_tracing():
    cfg = tiny_config()
    params = tiny_params(cfg)
    with pytest.raises(ValueError, match="d_forward"):
        jacobi_forward(cfg, params, tokens(1, 4), d_forward=0)
    with pytest.raises(ValueError, match="d_backward"):
        jacobi_forward(cfg, params, tokens(1, 4), d_forward=2, d_backward=-2)


def test_layer_indices_follow_the_release_conventions():
    cfg = recurrent(presets.smollm2_135m(), l_start=12, l_end=17)  # paper (13,18)
    assert cfg.layer_range == (12, 17)
    assert recurrent(presets.smollm2_135m(), l_start=4, l_end=-5).layer_range == (4, 25)  # paper (5,26)
    assert recurrent(presets.smollm2_135m(), l_start=7, l_end=7).layer_range == (7, 7)  # D = 1


def shapes(cfg):
    return jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))


def test_presets_match_published_sizes():
    assert 134e6 < count_params(shapes(presets.smollm2_135m())) < 135.5e6
    assert 361e6 < count_params(shapes(presets.smollm2_360m())) < 362.5e6
    assert 1.70e9 < count_params(shapes(presets.smollm2_1_7b())) < 1.72e9
    s5 = presets.s5_tiny()
    assert (s5.hidden_size, s5.num_layers, s5.num_heads, s5.mlp_dim, s5.rope_theta) == (384, 6, 6, 1536, None)


def test_parameter_matched_baseline_is_within_one_percent():
    t2mlr = count_params(shapes(recurrent(presets.smollm2_135m(), l_start=4, l_end=25)))
    plain = presets.smollm2_135m()
    width = matched_width(lambda h: count_params(shapes(plain.replace(hidden_size=h))), t2mlr, 576, 8)
    baseline = plain.replace(hidden_size=width)
    assert width == 584  # the release's 135M baseline
    assert abs(count_params(shapes(baseline)) / t2mlr - 1) < 0.01


def test_param_axes_cover_every_parameter_with_matching_rank():
    cfg = tiny_config()
    axes = param_axes(cfg)
    params = shapes(cfg)
    flat_axes = jax.tree.leaves(axes, is_leaf=lambda x: isinstance(x, tuple))
    assert len(flat_axes) == len(jax.tree.leaves(params))
    for a, p in zip(flat_axes, jax.tree.leaves(params)):
        assert len(a) == p.ndim
