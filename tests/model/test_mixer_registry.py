"""The mixer registry: a mixer registered from outside the package (here, this test module) runs in every
mode and converts to the release layout; unknown names are one error listing the registered ones. Jacobi
against exact: the depth rule of tests/tolerance.py over the recurrence's chain (test_recurrence.chain)."""

import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import Array, Float

from t2mlr_jax.architectures.t2mlr import recurrent, t2mlr_layout
from t2mlr_jax.architectures.t2mlr.mixers import MIXERS, Mixer
from t2mlr_jax.architectures.t2mlr.mixers.common import pre_norm
from t2mlr_jax.formats.tables import from_state_dict, to_state_dict
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.spec import ParamSpec
from t2mlr_jax.registry import Registry
from t2mlr_jax.studies.parity import recurrence_layers
from tests.tiny import exact, jacobi, plain, rel_err, tiny_config, tiny_params, tokens
from tests.tolerance import assert_fp32_close

T = 10


def toy_specs(cfg: ModelConfig) -> dict:
    d = cfg.hidden_size
    return {"toy_scale": ParamSpec((d,), ("norm",), lambda k, s, t: jnp.full(s, 0.5, t), "scalar")}


def toy_mix(
    cfg: ModelConfig, p: dict, x: Float[Array, "B T D"], r: Float[Array, "B T D"]
) -> tuple[Float[Array, "B T D"], dict]:
    """x + tanh(s) ⊙ r, one learned scale per channel."""
    xn, rn = pre_norm(cfg, p, x, r)
    gate = jnp.tanh(p["toy_scale"]).astype(x.dtype)
    return xn + gate * rn, {"recurrent_gate": jnp.broadcast_to(gate.mean(), x.shape[:-1])}


@pytest.fixture
def toy():
    MIXERS.register(
        "toy",
        Mixer(specs=toy_specs, mix=toy_mix, keys={("toy_scale",): "toy_scale"}, recurrent_projection=True),
    )
    try:
        yield recurrent(tiny_config(), mixer="toy")
    finally:
        MIXERS.unregister("toy")


@pytest.mark.numerics
def test_a_registered_mixer_runs_in_jacobi_and_exact_mode(toy):
    params = tiny_params(toy)
    assert set(params["mixer"]) == {"recurrent_projection", "toy_scale"}
    toks = tokens(2, T)
    want = exact(toy, params, toks)
    got = jacobi(toy, params, toks, d_forward=T, d_backward=2)
    assert_fp32_close(got.logits, want.logits, recurrence_layers(toy, T), "jacobi")
    assert rel_err(plain(toy, params, toks), want.logits) > 1e-2  # the recurrence is on
    # an analytic value: tanh(0.5) rounded in fp32, a few u = 6e-8
    np.testing.assert_allclose(want.gate_stats["recurrent_gate"][:, 1:], np.tanh(0.5), rtol=1e-6)


def test_a_registered_mixer_converts_to_the_release_layout(toy):
    params = tiny_params(toy, seed=1)
    layout = t2mlr_layout(toy)
    state = to_state_dict(layout, params)
    assert "t2mlr_model.model.layers.1.t2mlr_mixing_module.toy_scale" in state
    assert state["t2mlr_model.model.layers.1.t2mlr_mixing_module.recurrent_projection.weight"].shape == (
        32,
        32,
    )
    back = from_state_dict(layout, state)
    np.testing.assert_array_equal(back["mixer"]["toy_scale"], params["mixer"]["toy_scale"])


def test_unknown_mixer_names_list_the_registered_ones():
    with pytest.raises(ValueError, match=r"unknown mixer 'toy'; registered: .*gated.*none"):
        recurrent(tiny_config(), mixer="toy")


def test_registry_register_get_and_duplicates():
    registry = Registry("widget")
    registry.register("a", 1)

    @registry.register("b")
    def b():
        return 2

    assert registry.names() == ("a", "b") and registry.get("b") is b
    with pytest.raises(ValueError, match="widget 'a' is already registered"):
        registry.register("a", 3)
    with pytest.raises(ValueError, match="unknown widget 'c'; registered: a, b"):
        registry.get("c")
