"""train/muon.py, Muon's stacked Newton-Schulz: in fp32 it is optax's Muon update (to fp32 round-off) over
a tree of wide and tall matrices, stacked layer / expert axes and masked leaves; in bf16 it stays within
bf16 round-off of that, no further from fp32 than the same iterations run in torch bf16 (nanochat's
arithmetic); the matrices of one shape iterate together. The nanochat variant (optimizer.muon.variant),
through our optimizer, takes the LRT release's own MuonAdamW steps (tests/train/fixtures/nanochat_muon/,
made by `python -m experiments.make_nanochat_fixture muon`): to fp32 round-off in fp32, to the release's
own bf16 round-off in bf16."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from optax.contrib import MuonDimensionNumbers as Dims

from t2mlr_jax.model.spec import ParamSpec, normal
from t2mlr_jax.train.muon import NS_COEFFICIENTS, newton_schulz, orthogonalise, scale_by_muon
from t2mlr_jax.train.optimizer import NS_STEPS, Muon, make_optimizer
from tests.tiny import optimizer

MASKED = optax.transforms.MaskedNode()
RNG = np.random.default_rng(0)
SHAPES = {"wide": (3, 16, 40), "tall": (40, 16), "wide2": (16, 40), "experts": (2, 4, 16, 10)}
DIMS = {
    "wide": Dims(1, 2),
    "tall": Dims(0, 1),
    "wide2": Dims(0, 1),
    "experts": Dims((1,), (2, 3)),
    "norm": MASKED,
}
BF16_TOLERANCE = 0.03  # relative Frobenius distance of the bf16 update from the fp32 one


def _tree(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    tree = {k: jnp.asarray(rng.normal(size=s), jnp.float32) for k, s in SHAPES.items()}
    return {**tree, "norm": MASKED}


def _relative(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_fp32_is_optaxs_update_over_three_steps():
    ours = scale_by_muon(weight_dimension_numbers=DIMS, ns_dtype="float32")
    reference = optax.contrib.scale_by_muon(weight_dimension_numbers=DIMS)
    params = _tree(0)
    s_ours, s_ref = ours.init(params), reference.init(params)
    assert jax.tree.structure(s_ours) == jax.tree.structure(s_ref)  # checkpoints stay optax's
    for seed in range(1, 4):
        grads = _tree(seed)
        u_ours, s_ours = jax.jit(ours.update)(grads, s_ours)
        u_ref, s_ref = jax.jit(reference.update)(grads, s_ref)
        for key in SHAPES:
            np.testing.assert_allclose(u_ours[key], u_ref[key], rtol=1e-4, atol=2e-5)


def _torch_bf16(x: np.ndarray) -> np.ndarray:
    """The same iterations as nanochat runs them: a bf16 tensor through torch's bf16 matmuls."""
    torch = pytest.importorskip("torch")
    a, b, c = NS_COEFFICIENTS
    out = []
    for m in x:
        X = torch.tensor(m)
        X = (X / (X.norm() + 1e-8)).bfloat16()
        for _ in range(5):
            A = X @ X.mT
            X = a * X + (b * A + c * (A @ A)) @ X
        out.append(X.float().numpy())
    return np.stack(out)


@pytest.mark.parametrize("shape", [(4, 64, 256), (4, 64, 64)])
def test_bf16_stays_within_the_round_off_of_bf16_arithmetic(shape):
    x = jnp.asarray(RNG.normal(size=shape), jnp.float32)
    fp32 = newton_schulz(x, 5, jnp.asarray(NS_COEFFICIENTS), "float32")
    bf16 = newton_schulz(x, 5, jnp.asarray(NS_COEFFICIENTS), "bfloat16")
    tall = newton_schulz(x.mT, 5, jnp.asarray(NS_COEFFICIENTS), "bfloat16").mT
    ours, tall_error = _relative(bf16, fp32), _relative(tall, fp32)
    torch_error = _relative(_torch_bf16(np.asarray(x)), fp32)
    assert ours < BF16_TOLERANCE and tall_error < BF16_TOLERANCE
    assert ours < 1.5 * torch_error and tall_error < 1.5 * torch_error
    assert ours > 1e-4  # the iterations did run in bf16


def test_the_matrices_of_one_shape_iterate_together():
    """One batched iteration per wide shape: [3, 16, 40], [16, 40] and the tall [40, 16] (transposed)
    share one, the experts' (reduction 4, output 16 x 10) has its own: 2 shapes x 5 steps x 3 products."""
    tree = _tree(0)
    jaxpr = jax.make_jaxpr(lambda t: orthogonalise(t, DIMS, 5, jnp.asarray(NS_COEFFICIENTS), "bfloat16"))(
        tree
    )
    dots = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "dot_general"]
    assert len(dots) == 2 * 5 * 3
    assert {tuple(e.invars[0].aval.shape) for e in dots} == {(5, 16, 40), (2, 4, 160), (5, 16, 16), (2, 4, 4)}


# --- the nanochat variant against the release's MuonAdamW ---------------------------------------------------
RELEASE = dict(np.load(Path(__file__).parent / "fixtures/nanochat_muon/muon.npz"))
GROUPS = ("wide", "tall")  # torch (out, in): 2 x (8, 32), 2 x (32, 8)
# fp32 against fp32 (measured 4.2e-6 relative): ~100 fp32 operations per entry over 3 steps, amplified ~10x
# by Polar Express's sensitivity to its input (its 2% norm margin alone moves the step 25%). A beta2 of 0.9
# instead of 0.95 is 2e-3 away, a missing 1.02 or per-row / per-column swap 0.15-0.25, plain decay 0.6.
FP32_TOLERANCE = 1e-4
# Against the release's bf16 step as it runs (compiled: each product's output rounded to bf16, the
# elementwise work between them fused in fp32): its own distance from its algorithm in fp32 is up to
# RELEASE_BF16 (measured 0.085; its uncompiled run, every operation rounded, is 0.08-0.11 from its compiled
# one), and two independent bf16 roundings of it ~sqrt(2) x that apart. Measured: ours in fp32 0.086 from
# it, in bf16 0.108 (and 0.087 from the exact step).
RELEASE_BF16 = 0.1
BF16_RELEASE_TOLERANCE = 0.15


def _release_steps(variant: str, ns_dtype: str) -> list[dict[str, np.ndarray]]:
    """Our muon optimizer (make_optimizer: the muon group alone) stepping the fixture's parameters with its
    gradients and the release's settings: each group's parameters after each step, in torch's layout. A
    group is one [2, in, out] leaf (its matrices stacked on a layer axis, a batch axis of Muon's)."""
    specs = {
        g: ParamSpec(
            (2, *RELEASE[f"{g}:params"].shape[:1:-1]), ("layers", "embed", "mlp"), normal(1.0), "matrix", 1
        )
        for g in GROUPS
    }
    momentum = float(RELEASE["momentum"])
    settings = optimizer(
        name="muon",
        lr=1.0,
        schedule="constant",
        warmup_ratio=0.0,
        grad_clip=0.0,
        matrix_lr=float(RELEASE["lr"]),
        momentum_start=momentum,
        momentum_end=momentum,
        weight_decay=float(RELEASE["weight_decay"]),
        decay_depth=12,  # the decay as given
        beta2=float(RELEASE["beta2"]),
        batch_tokens=0,
        variant=variant,
        ns_dtype=ns_dtype,
    )
    tx = make_optimizer(settings, specs, 10)
    torch_layout = lambda x: np.swapaxes(np.asarray(x), -1, -2)
    params = {g: jnp.asarray(torch_layout(RELEASE[f"{g}:params"][0])) for g in GROUPS}
    state, update, after = tx.init(params), jax.jit(tx.update), []
    for t in range(RELEASE["wide:grads"].shape[0]):
        grads = {g: jnp.asarray(torch_layout(RELEASE[f"{g}:grads"][t])) for g in GROUPS}
        updates, state = update(grads, state, params)
        params = optax.apply_updates(params, updates)
        after.append({g: torch_layout(params[g]) for g in GROUPS})
    return after


def _step_distances(steps: list[dict], key: str) -> np.ndarray:
    """[step, group]: the relative Frobenius distance of p_t - p_0 (`steps`: each step's parameters by group,
    torch's layout) from the release's (`key`: "params", its bf16 step, or "params_fp32")."""
    start = {g: RELEASE[f"{g}:params"][0] for g in GROUPS}
    return np.array(
        [
            [_relative(p[g] - start[g], RELEASE[f"{g}:{key}"][t + 1] - start[g]) for g in GROUPS]
            for t, p in enumerate(steps)
        ]
    )


def test_the_fixture_is_the_recipes_muon_group():
    """The release's settings are our defaults (the nanochat recipe's Muon group, its decay nonzero), and its
    bf16 step is as far from its fp32 algorithm as BF16_RELEASE_TOLERANCE assumes."""
    m = Muon()
    settings = [float(RELEASE[k]) for k in ("lr", "momentum", "beta2", "ns_steps")]
    assert settings == [m.matrix_lr, m.momentum_end, m.beta2, NS_STEPS] and RELEASE["compiled"]
    assert float(RELEASE["weight_decay"]) > 0
    own = [{g: RELEASE[f"{g}:params"][t] for g in GROUPS} for t in (1, 2, 3)]
    assert 1e-3 < _step_distances(own, "params_fp32").max() < RELEASE_BF16


def test_the_nanochat_variant_in_fp32_is_the_releases_step_in_fp32():
    distances = _step_distances(_release_steps("nanochat", "float32"), "params_fp32")
    assert distances.max() < FP32_TOLERANCE, distances


@pytest.mark.parametrize("ns_dtype", ["float32", "bfloat16"])
def test_the_nanochat_variant_is_the_releases_step_to_its_bf16_round_off(ns_dtype):
    steps = _release_steps("nanochat", ns_dtype)
    distances = _step_distances(steps, "params")
    assert distances.max() < BF16_RELEASE_TOLERANCE, distances
    if ns_dtype == "bfloat16":  # ran in bf16, and within the same bound of the exact step
        exact = _step_distances(steps, "params_fp32")
        assert 1e-3 < exact.max() < BF16_RELEASE_TOLERANCE, exact


def test_the_optax_variant_is_not_the_releases_step():
    """What the tolerances above tell apart: optax's update is 0.38-0.61 from the release's."""
    assert _step_distances(_release_steps("optax", "float32"), "params").min() > 2 * BF16_RELEASE_TOLERANCE
