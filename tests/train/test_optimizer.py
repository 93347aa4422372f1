import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from t2mlr_jax.architectures.t2mlr import recurrent
from t2mlr_jax.config.edit import set_path
from t2mlr_jax.config.sections import SECTIONS
from t2mlr_jax.experiment import experiment, resolve
from t2mlr_jax.model.params import param_specs
from t2mlr_jax.model.spec import ParamSpec, freeze, init_from_specs, normal, ones
from t2mlr_jax.train.optimizer import (
    MUON_RECIPE,
    OPTIMIZERS,
    Muon,
    cautious_weight_decay,
    clip_by_global_norm,
    decay_mask,
    frozen_mask,
    lr_multipliers,
    make_optimizer,
    make_schedule,
    muon_decay,
    register_optimizer,
)
from tests.tiny import PINNED_MUON, pinned_optimizer, task_model

ADAMW = dict(name="adamw", b1=0.9, weight_decay=0.1, schedule="cosine", warmup_ratio=0.1, min_lr_ratio=0.1)


def opt(**changes):
    return pinned_optimizer(ADAMW, **changes)


# The schedules below are fp32 evaluations of a closed formula against its float64 value: a handful of
# operations, each within u = 2^-24 relative: 1e-5 relative (1e-6 absolute on values <= 2) holds on any CPU.
def test_cosine_with_min_lr_matches_hf_formula():
    total, warm = 100, 10  # ceil(0.1 * 100)
    s = make_schedule(opt(), total)
    assert float(s(0)) == 0.0 and float(s(5)) == pytest.approx(0.5)
    for step in (10, 40, 77, 100):
        progress = (step - warm) / (total - warm)
        expect = 0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * progress))
        assert float(s(step)) == pytest.approx(expect, rel=1e-5)
    assert float(s(100)) == pytest.approx(0.1)


def test_wsd_is_flat_then_decays_over_the_last_steps():
    s = make_schedule(opt(schedule="wsd", decay_steps=20, min_lr_ratio=0.0), 100)
    assert float(s(10)) == float(s(79)) == pytest.approx(1.0)
    assert float(s(90)) == pytest.approx(0.5, rel=1e-5)
    assert float(s(100)) == pytest.approx(0.0, abs=1e-6)


def test_bad_schedule_name_is_rejected():
    with pytest.raises(ValueError, match="schedule"):
        make_schedule(opt(schedule="linear"), 10)


# The parameter table of a tiny T²MLR model with every kind of parameter (pre-norm adds mixer norms).
SPECS = param_specs(recurrent(task_model(), l_start=1, l_end=1, pre_norm=True, cache_norm="rmsnorm"))
PARAMS = init_from_specs(SPECS, jax.random.PRNGKey(0), "float32")


def test_no_decay_on_norms_biases_and_gammas():
    """The mask read off the parameter kinds is the release's rule on names (no decay where the name holds
    bias, norm or rezero_gamma), on every parameter."""
    mask = decay_mask(SPECS)
    by_name = jax.tree_util.tree_map_with_path(
        lambda path, _: not any(n in jax.tree_util.keystr(path) for n in ("bias", "norm", "rezero_gamma")),
        PARAMS,
    )
    assert jax.tree.structure(mask) == jax.tree.structure(PARAMS)
    assert jax.tree.leaves(mask) == jax.tree.leaves(by_name)
    assert mask["layers"]["mlp"]["up_proj"] and not mask["layers"]["input_layernorm"]
    assert (
        not mask["mixer"]["rezero_gamma_recurrent_gate"] and not mask["mixer"]["recurrent_gate_proj"]["bias"]
    )


def test_an_unknown_optimizer_lists_the_registered_ones():
    with pytest.raises(ValueError, match="unknown optimizer 'adam'; registered: adamw, muon"):
        make_optimizer(opt(name="adam"), SPECS, 10)


@dataclasses.dataclass(frozen=True)
class Signed:
    scale: float = 1.0

    def __post_init__(self):
        if self.scale <= 0:
            raise ValueError(f"optimizer.signed.scale must be > 0, got {self.scale}")


def test_a_new_optimizer_brings_its_own_settings_section():
    """Registering an optimizer with a settings dataclass is all it takes: its section optimizer.<name> is
    in every config built after, edited and checked like any other, and read by its builder."""

    def signed(o, specs, schedule, total_steps):
        return optax.chain(optax.scale_by_sign(), optax.scale(-o.signed.scale))

    register_optimizer("signed", signed, Signed)
    try:
        config = experiment(name="unit", model=task_model(), data={"task": "s5_retrieval"})
        set_path(config, "optimizer.name", "signed")
        set_path(config, "optimizer.signed.scale", 0.5)
        section = resolve(config).optimizer
        assert section.signed == Signed(0.5)
        tx = make_optimizer(section, SPECS, 10)
        updates, _ = tx.update(jax.tree.map(jnp.ones_like, PARAMS), tx.init(PARAMS), PARAMS)
        assert all(bool((u == -0.5).all()) for u in jax.tree.leaves(updates))
        set_path(config, "optimizer.signed.scale", -1.0)
        with pytest.raises(ValueError, match="optimizer.signed.scale must be > 0"):
            resolve(config)
    finally:
        OPTIMIZERS.unregister("signed")
        SECTIONS.unregister("optimizer.signed")


@pytest.mark.slow
def test_gate_multiplier_scales_exactly_the_mixer_update():
    grads = jax.tree.map(lambda p: jnp.full_like(p, 0.5), PARAMS)
    plain = make_optimizer(opt(warmup_ratio=0.0), SPECS, 10)
    boosted = make_optimizer(opt(warmup_ratio=0.0, gate_lr_multiplier=100.0), SPECS, 10)
    u1, _ = plain.update(grads, plain.init(PARAMS), PARAMS)
    u100, _ = boosted.update(grads, boosted.init(PARAMS), PARAMS)
    np.testing.assert_allclose(  # one fp32 product by 100 apart: within 2u = 1.2e-7 relative
        u100["mixer"]["recurrent_gate_proj"]["kernel"],
        100 * u1["mixer"]["recurrent_gate_proj"]["kernel"],
        rtol=1e-6,
    )
    np.testing.assert_array_equal(u100["embed_tokens"], u1["embed_tokens"])
    assert lr_multipliers(SPECS, 3.0)["layers"]["mlp"]["up_proj"] == 1.0


@pytest.mark.slow
def test_clipping_rescales_gradients_to_the_global_norm_first():
    # eps=1 keeps Adam's first step scale-dependent, so clipping shows in the update.
    huge = jax.tree.map(lambda p: jnp.full_like(p, 1e3), PARAMS)
    unit = jax.tree.map(lambda g: g / optax.tree.norm(huge), huge)
    clipped, plain = (
        make_optimizer(opt(grad_clip=c, eps=1.0, warmup_ratio=0.0), SPECS, 10) for c in (1.0, 0.0)
    )
    u_clipped, _ = clipped.update(huge, clipped.init(PARAMS), PARAMS)
    u_unit, _ = plain.update(unit, plain.init(PARAMS), PARAMS)
    for a, b in zip(jax.tree.leaves(u_clipped), jax.tree.leaves(u_unit)):
        np.testing.assert_allclose(a, b, rtol=1e-5)


@pytest.mark.parametrize("max_norm", [0.5, 1e3])  # clipped, and left alone (the scale is then exactly 1)
def test_clipping_is_torchs_clip_grad_norm(max_norm):
    import torch

    grads = jax.tree.map(lambda p: jax.random.normal(jax.random.PRNGKey(p.size), p.shape), PARAMS)
    ours = clip_by_global_norm(max_norm).update(grads, optax.EmptyState())[0]
    tensors = [torch.nn.Parameter(torch.zeros(g.shape)) for g in jax.tree.leaves(grads)]
    for t, g in zip(tensors, jax.tree.leaves(grads)):
        t.grad = torch.tensor(np.asarray(g))
    torch.nn.utils.clip_grad_norm_(tensors, max_norm)
    for t, g in zip(tensors, jax.tree.leaves(ours)):
        np.testing.assert_allclose(np.asarray(g), t.grad.numpy(), rtol=1e-6)


# A frozen base (a decayed matrix and a norm) under a trained mixer: recirculation's adaptive variant.
MIXER_SPECS = {
    "kernel": ParamSpec((6, 4), ("mixer_in", "embed"), normal(0.5), "matrix", 1),
    "bias": ParamSpec((4,), ("embed",), normal(0.5), "bias"),
}
FROZEN_SPECS = {
    "base": freeze(
        {
            "kernel": ParamSpec((4, 3), ("embed", "mlp"), normal(0.5), "matrix", 1),
            "norm": ParamSpec((4,), ("norm",), ones, "norm"),
        }
    ),
    "mixer": MIXER_SPECS,
}
FROZEN_PARAMS = init_from_specs(FROZEN_SPECS, jax.random.PRNGKey(1), "float32")
MUON = {**PINNED_MUON, "momentum_warmup_steps": 0}
NAMES = {"adamw": {}, "muon": MUON}


def test_freeze_marks_every_spec_and_the_mask_reads_it():
    assert frozen_mask(FROZEN_SPECS) == {
        "base": {"kernel": True, "norm": True},
        "mixer": {"kernel": False, "bias": False},
    }
    assert (
        FROZEN_SPECS["base"]["kernel"].kind == "matrix" and not ParamSpec((1,), (None,), ones, "gate").frozen
    )


@pytest.mark.parametrize("name", NAMES)
def test_frozen_parameters_never_move(name):
    """Non-zero gradients, weight decay and clipping: the frozen base stays bitwise put, the mixer moves."""
    tx = make_optimizer(
        opt(**NAMES[name], weight_decay=0.5, warmup_ratio=0.0, grad_clip=1.0), FROZEN_SPECS, 10
    )
    params, state = FROZEN_PARAMS, tx.init(FROZEN_PARAMS)
    update = jax.jit(tx.update)
    for i in range(3):
        grads = jax.tree.map(lambda p: jnp.full_like(p, 0.5 + i), params)
        updates, state = update(grads, state, params)
        params = optax.apply_updates(params, updates)
    for a, b in zip(jax.tree.leaves(params["base"]), jax.tree.leaves(FROZEN_PARAMS["base"])):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(jax.tree.leaves(params["mixer"]), jax.tree.leaves(FROZEN_PARAMS["mixer"])):
        assert not np.allclose(a, b)


@pytest.mark.parametrize("name", NAMES)
def test_frozen_gradients_stay_out_of_the_clip(name):
    """A huge gradient on the frozen base leaves the mixer's clipped update as if the base were absent."""
    config = opt(**NAMES[name], warmup_ratio=0.0, grad_clip=1.0)
    grads = jax.tree.map(lambda p: jnp.full_like(p, 2.0), FROZEN_PARAMS)
    grads["base"] = jax.tree.map(lambda g: jnp.full_like(g, 1e12), grads["base"])
    tx, alone = make_optimizer(config, FROZEN_SPECS, 10), make_optimizer(config, MIXER_SPECS, 10)
    updates, _ = tx.update(grads, tx.init(FROZEN_PARAMS), FROZEN_PARAMS)
    expect, _ = alone.update(grads["mixer"], alone.init(FROZEN_PARAMS["mixer"]), FROZEN_PARAMS["mixer"])
    for a, b in zip(jax.tree.leaves(updates["mixer"]), jax.tree.leaves(expect)):
        np.testing.assert_allclose(a, b, rtol=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_an_unused_parameter_keeps_its_state_whichever_way_use_is_told(name):
    """A leaf whose whole gradient is zero (the step did not use it) gets no update and keeps its moments,
    as torch skips a parameter without a gradient; told by the train step's squared norms (`grad_sq_norms`)
    or found in the gradient itself, bitwise the same steps, decay and clipping on."""
    tx = make_optimizer(
        opt(**NAMES[name], weight_decay=0.5, warmup_ratio=0.0, grad_clip=1.0), MIXER_SPECS, 10
    )
    params = FROZEN_PARAMS["mixer"]
    sq_norms = lambda g: jax.tree.map(lambda a: jnp.sum(jnp.square(a)), g)
    found = jax.jit(lambda g, s, p: tx.update(g, s, p, grad_norm=optax.tree.norm(g)))
    told = jax.jit(
        lambda g, s, p: tx.update(g, s, p, grad_norm=optax.tree.norm(g), grad_sq_norms=sq_norms(g))
    )
    state = {"found": tx.init(params), "told": tx.init(params)}
    for i in range(3):
        grads = jax.tree.map(lambda p: jnp.full_like(p, 0.5 + i), params)
        if i == 2:  # a step that did not use the bias
            grads["bias"] = jnp.zeros_like(grads["bias"])
            before = state["told"]
        (u_found, state["found"]), (u_told, state["told"]) = (
            found(grads, state["found"], params),
            told(grads, state["told"], params),
        )
        for a, b in zip(jax.tree.leaves((u_found, state["found"])), jax.tree.leaves((u_told, state["told"]))):
            np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(u_told["bias"], 0.0)
    assert np.abs(u_told["kernel"]).max() > 0
    moved = [
        not np.array_equal(a, b)
        for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(state["told"]))
        if np.shape(a) == params["bias"].shape
    ]
    assert moved and not any(moved)  # the bias's moments as they were


def test_cautious_decay_on_a_schedule_anneals_as_nanochats_base_train():
    """decay_schedule "linear": at update n the decay is weight_decay x (1 - n / steps) (base_train's
    get_weight_decay), 0 from the last step on, applied only where u x p >= 0; constant: weight_decay
    throughout, with no state. MUON_RECIPE anneals."""
    p, u = {"w": jnp.array([1.0, -1.0, 2.0])}, {"w": jnp.array([1.0, 1.0, 0.0])}
    for schedule, rate in (("linear", lambda n: 0.5 * max(0.0, 1 - n / 4)), ("constant", lambda n: 0.5)):
        settings = Muon(weight_decay=0.5, decay_depth=12, decay_schedule=schedule)  # 12: the decay as given
        tx = cautious_weight_decay(muon_decay(settings, SPECS, total_steps=4))
        state = tx.init(p)
        assert (schedule == "constant") == isinstance(state, optax.EmptyState)
        for n in range(6):
            out, state = tx.update(u, state, p)
            expected = [1 + rate(n), 1.0, 2 * rate(n)]  # the second: u x p < 0, never decayed
            np.testing.assert_allclose(out["w"], expected, rtol=1e-6, err_msg=f"{schedule}, update {n}")
    assert MUON_RECIPE["optimizer.muon.decay_schedule"] == "linear"
    with pytest.raises(ValueError, match="optimizer.muon.decay_schedule must be one of"):
        Muon(decay_schedule="cosine")
