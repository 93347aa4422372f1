"""The `muon` optimizer (nanochat's MuonAdamW): groups read off the kinds, per-layer orthogonalisation,
group LRs, momentum warmup, the linear_decay schedule and the matrices' weight decay."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from t2mlr_jax.architectures.t2mlr import recurrent
from t2mlr_jax.config.edit import set_path
from t2mlr_jax.experiment import resolve
from t2mlr_jax.model.params import param_specs
from t2mlr_jax.model.spec import KINDS, ParamSpec, init_from_specs, is_spec, normal, spec_shapes
from t2mlr_jax.train.muon import NanochatMuonState
from t2mlr_jax.train.optimizer import (
    MUON_RECIPE,
    make_optimizer,
    make_schedule,
    momentum_schedule,
    muon_depth,
    muon_group_lrs,
    muon_labels,
    muon_weight_decay,
    muon_width,
    scale_by_muon,
)
from tests.tiny import PINNED_MUON, pinned_optimizer, task_model, tiny_experiment

L, D, H, E, X, F, V = 2, 8, 2, 4, 3, 12, 16
init = normal(0.5)

# A table with every kind: a q_proj-like [L, D, H, E] matrix, an expert matrix [L, X, D, F], a mixer.
SPECS = {
    "embed_tokens": ParamSpec((V, D), ("vocab", "embed"), init, "embedding"),
    "lm_head": ParamSpec((D, V), ("embed", "vocab"), init, "head", 1),
    "layers": {
        "q_proj": ParamSpec((L, D, H, E), ("layers", "embed", "heads", "head_dim"), init, "matrix", 1),
        "experts_up": ParamSpec((L, X, D, F), ("layers", "experts", "embed", "mlp"), init, "matrix", 1),
        "input_layernorm": ParamSpec((L, D), ("layers", "norm"), init, "norm"),
        "up_bias": ParamSpec((L, F), ("layers", "mlp"), init, "bias"),
    },
    "mixer": {
        "kernel": ParamSpec((2 * D, D), ("mixer_in", "embed"), init, "matrix", 1),
        "rezero_gamma": ParamSpec((1,), (None,), init, "gate"),
        "alpha": ParamSpec((1,), (None,), init, "scalar"),
    },
    "resid_lambdas": ParamSpec((L,), ("layers",), init, "residual"),
    "x0_lambdas": ParamSpec((L,), ("layers",), init, "skip"),
}
PARAMS = init_from_specs(SPECS, jax.random.PRNGKey(0), "float32")


# nanochat's b1, group LRs and momentum at a constant LR 1, no weight decay.
MUON = {
    **PINNED_MUON,
    "weight_decay": 0.0,
    "schedule": "constant",
    "warmup_ratio": 0.0,
    "min_lr_ratio": 0.0,
    "momentum_warmup_steps": 300,
}


def opt(**changes):
    return pinned_optimizer(MUON, **changes)


def step(tx, grads, params=PARAMS, state=None):
    return jax.jit(tx.update)(grads, tx.init(params) if state is None else state, params)


def test_groups_are_read_off_the_kinds():
    assert {s.kind for s in jax.tree.leaves(SPECS, is_leaf=is_spec)} == set(KINDS)
    assert muon_labels(SPECS) == {
        "embed_tokens": "embedding",
        "lm_head": "head",
        "layers": {"q_proj": "muon", "experts_up": "muon", "input_layernorm": "scalar", "up_bias": "scalar"},
        "mixer": {"kernel": "muon", "rezero_gamma": "scalar", "alpha": "scalar"},
        "resid_lambdas": "residual",
        "x0_lambdas": "skip",
    }
    assert muon_width(SPECS) == D and muon_depth(SPECS) == L


BATCH_SCALE = 0.5  # sqrt(2**17 / 2**19)
GROUP_LRS = {
    "muon": 0.02 * BATCH_SCALE,
    "embedding": 0.3 * (D / 768) ** -0.5 * BATCH_SCALE,
    "head": 0.004 * (D / 768) ** -0.5 * BATCH_SCALE,
    "scalar": 0.5 * BATCH_SCALE,
    "residual": 0.5 * 0.01 * BATCH_SCALE,
    "skip": 0.5 * BATCH_SCALE,
}


@pytest.fixture(scope="module")
def first_step():
    """One jitted step on unit gradients, through clipping, with optimizer.lr (the schedule's scale, which
    the multiplier divides out) != 1 and batch scaling on."""
    tx = make_optimizer(opt(lr=5e-4, batch_tokens=2**17, grad_clip=1.0), SPECS, 10)
    updates, state = step(tx, jax.tree.map(jnp.ones_like, PARAMS))
    return tx, updates, state


def test_group_lrs_follow_the_config_width_and_batch(first_step):
    assert muon_group_lrs(opt(batch_tokens=2**17).muon, SPECS) == pytest.approx(GROUP_LRS)
    assert muon_group_lrs(opt().muon, SPECS)["embedding"] == pytest.approx(0.3 * (D / 768) ** -0.5)
    # The first Adam step is -lr exactly (m_hat / sqrt(v_hat) = 1 whatever the gradient's scale).
    updates, labels = first_step[1], muon_labels(SPECS)
    for u, label in zip(jax.tree.leaves(updates), jax.tree.leaves(labels)):
        assert bool(jnp.isfinite(u).all())
        if label != "muon":
            np.testing.assert_allclose(u, -GROUP_LRS[label], rtol=1e-5, err_msg=label)


@pytest.mark.parametrize("variant", ["optax", "nanochat"])
def test_moments_map_onto_the_params_for_sharding(variant):
    """The trainer shards optimizer moments like their params (optax.tree_map_params). Each group's moments
    hold MaskedNodes at the other groups' leaves, so the map must keep those (is_leaf). The nanochat
    variant's factored second moments (size 1 on a side) are not params-shaped: they stay other state
    (replicated), as a param's sharding may split a side they hold at size 1."""
    tx = make_optimizer(opt(variant=variant), SPECS, 10)
    state = tx.init(PARAMS)
    masked = lambda x: isinstance(x, optax.transforms.MaskedNode)
    shapes = optax.tree_map_params(
        tx,
        lambda leaf, p: leaf if masked(leaf) else str(p.shape),
        state,
        PARAMS,
        transform_non_params=lambda _: None,
        is_leaf=masked,
    )
    mapped = [s for s in jax.tree.leaves(shapes) if s is not None]
    assert set(mapped) == {str(p.shape) for p in jax.tree.leaves(PARAMS)}
    nanochat = lambda tree: [
        x
        for x in jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, NanochatMuonState))
        if hasattr(x, "nu")
    ]
    if variant == "optax":
        assert nanochat(state) == []
        return
    ((ours,), (mapped,)) = nanochat(state), nanochat(shapes)
    # experts_up, q_proj (a tie: per fan-out entry), the mixer's kernel (fan_in 2D > fan_out D: per fan-in)
    assert [x.shape for x in jax.tree.leaves(ours.nu)] == [(L, X, 1, F), (L, 1, H, E), (2 * D, 1)]
    assert jax.tree.leaves(mapped.nu) == []  # all None: no param's sharding


def newton_schulz(g: np.ndarray) -> np.ndarray:
    """optax's 5-step quintic Newton-Schulz of one 2-D matrix, in numpy."""
    x = g.T if g.shape[0] > g.shape[1] else g
    x = x / (np.linalg.norm(x) + 1e-8)
    for _ in range(5):
        a = x @ x.T
        x = 3.4445 * x + (-4.7750 * a + 2.0315 * a @ a) @ x
    return x.T if g.shape[0] > g.shape[1] else x


def test_each_layer_is_orthogonalised_on_its_own():
    """The first Muon step on [L, din, dout] is the Newton-Schulz of every layer's gradient slice (its
    Nesterov momentum is a multiple of it) x the shape scale sqrt(dout / din); folding the layer axis
    into the matrix gives another answer (the layers' gradients differ in scale by 100x)."""
    specs = {"w": ParamSpec((3, 6, 10), ("layers", "embed", "mlp"), init, "matrix", 1)}
    g = jax.random.normal(jax.random.PRNGKey(1), (3, 6, 10)) * jnp.array([1.0, 10.0, 100.0])[:, None, None]
    fp32 = opt(ns_dtype="float32").muon
    u = np.asarray(step(scale_by_muon(fp32, specs), {"w": g}, {"w": jnp.zeros((3, 6, 10))})[0]["w"])
    g = np.asarray(g, np.float64)
    per_layer = np.stack([newton_schulz(g[i]) for i in range(3)]) * np.sqrt(10 / 6)
    np.testing.assert_allclose(u, per_layer, rtol=2e-3, atol=2e-4)
    folded = newton_schulz(g.reshape(18, 10)).reshape(3, 6, 10) * np.sqrt(10 / 18)
    assert np.abs(u - folded).max() > 0.1
    for i in range(3):  # 5 steps leave each slice's singular values in optax's band around 1
        sv = np.linalg.svd(u[i] / np.sqrt(10 / 6), compute_uv=False)
        assert 0.5 < sv.min() and sv.max() < 1.5


def test_gate_lr_multiplier_scales_the_mixer_update():
    specs = {"mixer": SPECS["mixer"], "lm_head": SPECS["lm_head"]}
    params = {"mixer": PARAMS["mixer"], "lm_head": PARAMS["lm_head"]}
    grads = jax.tree.map(lambda p: jnp.sin(10 * p), params)
    u1 = step(make_optimizer(opt(), specs, 10), grads, params)[0]
    u100 = step(make_optimizer(opt(gate_lr_multiplier=100.0), specs, 10), grads, params)[0]
    for name in ("kernel", "rezero_gamma", "alpha"):  # two compiled programs: fp32 round-off apart
        np.testing.assert_allclose(u100["mixer"][name], 100 * u1["mixer"][name], rtol=1e-3)
    np.testing.assert_array_equal(u100["lm_head"], u1["lm_head"])


def test_momentum_warms_up_linearly_and_the_optimizer_uses_it():
    beta = momentum_schedule(opt().muon)
    assert [float(beta(s)) for s in (0, 150, 300, 1000)] == pytest.approx([0.85, 0.90, 0.95, 0.95])
    assert float(momentum_schedule(opt(momentum_warmup_steps=0).muon)(0)) == pytest.approx(0.95)
    # In the optimizer: the beta of each update (recorded in the state) follows the step.
    specs, params = {"q_proj": SPECS["layers"]["q_proj"]}, {"q_proj": PARAMS["layers"]["q_proj"]}
    tx = make_optimizer(opt(momentum_warmup_steps=2), specs, 10)
    grads, state, used = jax.tree.map(jnp.ones_like, params), None, []
    for _ in range(4):
        _, state = step(tx, grads, params, state)
        used.append(float(optax.tree.get(state, "beta", filtering=lambda _, v: isinstance(v, jax.Array))))
    assert used == pytest.approx([0.85, 0.90, 0.95, 0.95])


def test_linear_decay_is_flat_then_linear_to_the_floor():
    """fp32 evaluations of a closed formula against its value: a few operations within u = 2^-24 each."""
    s = make_schedule(opt(schedule="linear_decay"), 100)
    assert [float(s(i)) for i in (0, 30, 50, 75, 99, 100)] == pytest.approx([1, 1, 1, 0.5, 0.02, 0], abs=1e-6)
    s = make_schedule(opt(schedule="linear_decay", lr=2.0, warmup_ratio=0.1, min_lr_ratio=0.1), 100)
    assert [float(s(i)) for i in (5, 10, 50, 100)] == pytest.approx([1.0, 2.0, 2.0, 0.2], abs=1e-6)
    with pytest.raises(ValueError, match="decay_ratio"):
        make_schedule(opt(schedule="linear_decay", decay_ratio=1.5), 100)


def test_weight_decay_only_on_matrices_scaled_by_depth_and_lr():
    """The decay is what a decaying optimizer's updates add to those of one without it, on the same
    gradients: -lr(t) x wd x (12 / L)^2 x p on the matrices, nothing elsewhere."""
    o = opt(weight_decay=0.1, schedule="linear_decay", decay_ratio=1.0)  # multiplier 1 - step / 10
    assert muon_weight_decay(o.muon, SPECS) == pytest.approx(0.1 * (12 / L) ** 2)
    # a fixed decay_depth: every depth decays alike (a comparison on depth keeps decay out of it)
    assert muon_weight_decay(opt(weight_decay=0.2, decay_depth=12).muon, SPECS) == pytest.approx(0.2)
    grads = jax.tree.map(jnp.ones_like, PARAMS)

    def two_steps(o):
        tx = make_optimizer(o, SPECS, 10)
        u0, state = step(tx, grads)
        return u0, step(tx, grads, state=state)[0]

    decayed, plain = two_steps(o), two_steps(opt(schedule="linear_decay", decay_ratio=1.0))
    labels = muon_labels(SPECS)
    for u, mult in ((jax.tree.map(jnp.subtract, d, q), m) for d, q, m in zip(decayed, plain, (1.0, 0.9))):
        for up, p, label in zip(jax.tree.leaves(u), jax.tree.leaves(PARAMS), jax.tree.leaves(labels)):
            expect = -0.02 * mult * 0.1 * 36 * p if label == "muon" else jnp.zeros_like(p)
            np.testing.assert_allclose(up, expect, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(momentum_end=1.0), "momentum_end must be in"),
        (dict(momentum_start=-0.1), "momentum_start must be in"),
        (dict(matrix_lr=-1.0), "matrix_lr must be >= 0"),
        (dict(embedding_lr=-0.3), "embedding_lr must be >= 0"),
        (dict(momentum_warmup_steps=-1), "momentum_warmup_steps"),
        (dict(variant="torch"), "variant must be one of"),
        (dict(beta2=1.0), "beta2 must be in"),
        (dict(lr=0.0), "optimizer.lr must be > 0"),
    ],
)
def test_bad_settings_are_one_error_at_build_time(change, message):
    with pytest.raises(ValueError, match=message):
        make_optimizer(opt(**change), SPECS, 10)


def test_a_matrix_without_fan_in_is_rejected():
    specs = {"w": ParamSpec((2, 4, 4), ("layers", "embed", "mlp"), init, "matrix")}  # in_dims=0
    with pytest.raises(ValueError, match="muon: matrix w"):
        make_optimizer(opt(), specs, 10)


def test_the_config_defaults_select_muon_for_a_t2mlr_model():
    """`optimizer.name=muon` (and nanochat's recipe) on the default config section and a real T²MLR table
    (mixer parameters are kinds gate / scalar / matrix)."""
    config = tiny_experiment()
    for path, value in MUON_RECIPE.items():
        set_path(config, path, value)
    config.optimizer.muon.batch_tokens = config.train.batch_size * config.data.seq_len
    specs = param_specs(recurrent(task_model(), l_start=1, l_end=1, pre_norm=True))
    params = spec_shapes(specs, "float32")
    tx = make_optimizer(resolve(config).optimizer, specs, 10)
    updates, _ = jax.eval_shape(tx.update, params, jax.eval_shape(tx.init, params), params)
    assert jax.tree.map(lambda u: u.shape, updates) == jax.tree.map(lambda p: p.shape, params)
    assert muon_labels(specs)["mixer"]["rezero_gamma_recurrent_gate"] == "scalar"


@pytest.mark.parametrize(
    "arch", ["transformer", "looped", "middle_looped", "pause", "lstm", "lrt", "ponderlm2"]
)
def test_muon_is_selectable_for_every_architecture(arch):
    """Every architecture's table carries the kinds Muon's groups read: its update builds and keeps the
    parameters' shapes, with the matrices in the muon group and everything else in an AdamW one."""
    from t2mlr_jax.architectures import build_architecture

    config = tiny_experiment(arch)
    for path, value in MUON_RECIPE.items():
        set_path(config, path, value)
    specs = build_architecture(resolve(config), arch).specs
    params = spec_shapes(specs, "float32")
    tx = make_optimizer(resolve(config).optimizer, specs, 10)
    updates, _ = jax.eval_shape(tx.update, params, jax.eval_shape(tx.init, params), params)
    assert jax.tree.map(lambda u: u.shape, updates) == jax.tree.map(lambda p: p.shape, params)
    labels = jax.tree.leaves(muon_labels(specs))
    assert "muon" in labels and len(set(labels)) > 1


@pytest.mark.parametrize("variant", ["optax", "nanochat"])
def test_a_parameter_the_step_did_not_use_stays_as_it_was(variant):
    """PyTorch's semantics (a parameter whose gradient is None is skipped), which optax's Adam and Muon lack:
    after a step that used every parameter, a step whose gradient is all zero at some leaves (a Muon
    matrix, an Adam scalar; the LRT's thought-slot parameters on a K = 0 step) leaves those leaves and
    their moments exactly as they were (the nanochat variant's factored second moment too), while the
    other leaves move on."""
    tx = make_optimizer(opt(grad_clip=1.0, variant=variant), SPECS, 10)
    grads = jax.tree.map(jnp.ones_like, PARAMS)
    _, state = step(tx, grads)
    idle = {**grads, "mixer": {**grads["mixer"], "kernel": jnp.zeros((2 * D, D)), "alpha": jnp.zeros((1,))}}
    updates, after = step(tx, idle, state=state)
    assert not np.any(np.asarray(updates["mixer"]["kernel"])) and not np.any(
        np.asarray(updates["mixer"]["alpha"])
    )
    assert np.all(np.asarray(updates["mixer"]["rezero_gamma"]) != 0) and np.any(
        np.asarray(updates["lm_head"])
    )
    moved, kept = 0, []
    for (path, old), new in zip(jax.tree_util.tree_flatten_with_path(state)[0], jax.tree.leaves(after)):
        name = jax.tree_util.keystr(path)
        if name.endswith("['mixer']['kernel']") or name.endswith("['mixer']['alpha']"):
            np.testing.assert_array_equal(new, old, err_msg=name)
            kept.append(name)
        elif ".mu" in name or ".nu" in name:
            moved += not np.array_equal(new, old)
    assert moved >= 5  # the used leaves' moments did move
    factored = [n for n in kept if ".nu" in n and n.endswith("['kernel']")]  # NorMuon's, of the matrix
    assert len(factored) == (variant == "nanochat")
    # optax alone would have moved the idle leaves along their momentum
    plain = optax.adam(0.1)
    s = plain.update(grads, plain.init(PARAMS), PARAMS)[1]
    assert np.any(np.asarray(plain.update(idle, s, PARAMS)[0]["mixer"]["alpha"]))
