"""train/muon.py, Muon's stacked Newton-Schulz: in fp32 it is optax's Muon update (to fp32 round-off) over
a tree of wide and tall matrices, stacked layer / expert axes and masked leaves; in bf16 it stays within
bf16 round-off of that, no further from fp32 than the same iterations run in torch bf16 (nanochat's
arithmetic); the matrices of one shape iterate together."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from optax.contrib import MuonDimensionNumbers as Dims

from t2mlr_jax.train.muon import NS_COEFFICIENTS, newton_schulz, orthogonalise, scale_by_muon

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
