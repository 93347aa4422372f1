"""The mixture-of-experts MLP: sorted dispatch (dropless: grouped matmuls, the buffer with C = N on CPU; with
capacity: the buffer) equals a dense reference (every expert on every token, masked by the routing), with
and without capacity drops, gradients included, and the dispatches each other where nothing drops (TPU's
megablox kernels run by Pallas's interpreter); the platform picks the dispatch; routing semantics;
balancing.

Bounds: the dispatch against the dense reference by the float64 rule of tests/tolerance.py (one MoE MLP:
depth 1, its vector-Jacobian product 2), measured against the dense reference's own fp32 error, with
`float64_reference` (outputs and VJP written out in numpy) the float64 evaluation. The depth rule's
per-block allowance does not hold for one MoE here (init_std 0.3: relu^2 hidden values up to ~10, summed
with cancellation): dispatch and dense outputs differ by 8.3 u * scale, over the 4 u * scale the depth
rule allows a block."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2mlr_jax.model import moe
from t2mlr_jax.model.config import MLP_NAMES, ModelConfig
from t2mlr_jax.model.layers import MLPS
from t2mlr_jax.model.spec import init_from_specs, spec_leaves
from tests.tiny import rel_err, tiny_moe_config
from tests.tolerance import assert_fp32_close, assert_near_f64, fp32_bound, in_float64, scale_of

X, K, D, F = 4, 2, 32, 24  # tiny_moe_config's experts, their top k, the hidden and MLP widths
B, T = 2, 8


def layer_params(cfg: ModelConfig, seed: int = 0) -> dict:
    """Layer 0's slice of freshly drawn MoE params."""
    stacked = init_from_specs(moe.moe_specs(cfg), jax.random.PRNGKey(seed), "float32")
    return jax.tree.map(lambda a: a[0], stacked)


def inputs(seed: int = 1):
    return jax.random.normal(jax.random.PRNGKey(seed), (B, T, D))


def kept_assignments(experts: np.ndarray, capacity: int) -> np.ndarray:
    """[N, K] bool: the assignments within their expert's capacity, in (token, pick) order (a loop)."""
    used = np.zeros(X, int)
    keep = np.zeros(experts.shape, bool)
    for n in range(experts.shape[0]):
        for k in range(experts.shape[1]):
            e = experts[n, k]
            keep[n, k] = used[e] < capacity
            used[e] += 1
    return keep


def dense_reference(cfg, p, x, bias, keep=None):
    """Every expert on every token; each token's output mixes its routed experts' outputs (independent
    routing: top-k by a descending argsort; `keep` [N, K] removes dropped assignments)."""
    n = x.shape[0] * x.shape[1]
    xf = x.reshape(n, -1).astype(jnp.float32)
    scores = jax.nn.sigmoid(xf @ p["router"])
    experts = jnp.argsort(-(scores + bias), axis=-1)[:, : cfg.moe_top_k]
    picked = jnp.take_along_axis(scores, experts, axis=-1)
    weights = picked / picked.sum(-1, keepdims=True)
    if keep is not None:
        weights = weights * keep
    mix = jnp.zeros((n, cfg.moe_experts)).at[jnp.arange(n)[:, None], experts].add(weights)
    hidden = jnp.square(jax.nn.relu(jnp.einsum("nd,xdf->xnf", xf, p["up_proj"])))
    every = jnp.einsum("xnf,xfd->xnd", hidden, p["down_proj"])
    y = jnp.einsum("nx,xnd->nd", mix, every)
    if "shared" in p:
        h = jnp.square(jax.nn.relu(xf @ p["shared"]["up_proj"]))
        y = y + h @ p["shared"]["down_proj"]
    return y.reshape(x.shape), experts


def float64_reference(cfg, p, x, bias, keep=None, cotangent=None):
    """dense_reference in float64 numpy, with its vector-Jacobian product at `cotangent` (default cos(y):
    the gradient of sum(sin(y))) with respect to (p, x) written out: returns y and that gradient in the
    structure jax.vjp gives (a params dict, then x)."""
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), p)
    xf = np.asarray(x, np.float64).reshape(-1, cfg.hidden_size)
    n = xf.shape[0]
    scores = 1 / (1 + np.exp(-(xf @ p["router"])))
    experts = np.argsort(-(scores + np.asarray(bias, np.float64)), axis=-1, kind="stable")[:, : cfg.moe_top_k]
    picked = np.take_along_axis(scores, experts, axis=-1)
    weights = picked / picked.sum(-1, keepdims=True) * (1 if keep is None else keep)
    mix = np.zeros((n, cfg.moe_experts))
    np.put_along_axis(mix, experts, weights, axis=-1)
    act = np.maximum(np.einsum("nd,xdf->xnf", xf, p["up_proj"]), 0.0)  # relu(x U_e)
    out = np.einsum("xnf,xfd->xnd", act**2, p["down_proj"])
    y = np.einsum("nx,xnd->nd", mix, out)
    if "shared" in p:
        shared = np.maximum(xf @ p["shared"]["up_proj"], 0.0)
        y = y + shared**2 @ p["shared"]["down_proj"]
    g = np.cos(y) if cotangent is None else np.asarray(cotangent, np.float64).reshape(y.shape)
    grad = {"down_proj": np.einsum("xnf,nx,nd->xfd", act**2, mix, g)}
    d_act = 2 * act * np.einsum("nx,nd,xfd->xnf", mix, g, p["down_proj"])
    grad["up_proj"] = np.einsum("nd,xnf->xdf", xf, d_act)
    dx = np.einsum("xnf,xdf->nd", d_act, p["up_proj"])
    d_weights = np.take_along_axis(np.einsum("nd,xnd->nx", g, out), experts, axis=-1)
    if keep is not None:
        d_weights = d_weights * keep
    d_picked = (d_weights - (weights * d_weights).sum(-1, keepdims=True)) / picked.sum(-1, keepdims=True)
    d_scores = np.zeros_like(scores)
    np.put_along_axis(d_scores, experts, d_picked, axis=-1)
    d_logits = d_scores * scores * (1 - scores)
    grad["router"] = xf.T @ d_logits
    dx = dx + d_logits @ p["router"].T
    if "shared" in p:
        d_shared = 2 * shared * (g @ p["shared"]["down_proj"].T)
        grad["shared"] = {"down_proj": (shared**2).T @ g, "up_proj": xf.T @ d_shared}
        dx = dx + d_shared @ p["shared"]["up_proj"].T
    return y.reshape(x.shape), (grad, dx.reshape(x.shape))


apply = jax.jit(moe.moe_apply, static_argnums=0)


def forced(monkeypatch, path: str):
    """moe_apply with its dropless dispatch forced to `path` ("ragged_dot", "gmm": megablox's kernels run by
    Pallas's interpreter; this CPU's own is the buffer), jitted afresh: a jit of `apply` traced under
    another path would be taken from its cache."""
    monkeypatch.setattr(moe, "dispatch_path", lambda cfg: "buffer" if cfg.moe_capacity_factor else path)
    if path == "gmm":
        monkeypatch.setattr(moe, "_grouped_matmul", functools.partial(moe._grouped_matmul, interpret=True))
    return jax.jit(lambda cfg, p, x, state: moe.moe_apply(cfg, p, x, state), static_argnums=0)


def test_registered_with_its_specs():
    assert "moe" in MLP_NAMES and MLPS["moe"].apply is moe.moe_apply
    cfg = tiny_moe_config(moe_shared=2, moe_dim=12, init_scheme="nanochat")
    specs = spec_leaves(moe.moe_specs(cfg))
    up, down, router = specs[("up_proj",)], specs[("down_proj",)], specs[("router",)]
    assert (up.shape, up.axes, up.kind) == ((2, X, D, 12), ("layers", "experts", "embed", "mlp"), "matrix")
    assert (down.shape, down.axes) == ((2, X, 12, D), ("layers", "experts", "mlp", "embed"))
    assert up.stacked == 2 and up.fan_in == (2,) and up.fan_out == (3,) and down.fan_in == (2,)
    assert (router.shape, router.axes, router.kind, router.fan_in) == (
        (2, D, X),
        ("layers", "embed", None),
        "matrix",
        (1,),
    )
    assert specs[("shared", "up_proj")].shape == (2, D, 24) and specs[("shared", "down_proj")].shape == (
        2,
        24,
        D,
    )
    params = init_from_specs(moe.moe_specs(cfg), jax.random.PRNGKey(0), "float32")
    assert not np.any(params["down_proj"]) and not np.any(params["shared"]["down_proj"])  # role "out": zero
    assert "shared" not in moe.moe_specs(tiny_moe_config(moe_shared=0))
    state = moe.moe_init_state(cfg)
    assert state["router_bias"].shape == (2, X) and state["router_bias"].dtype == jnp.float32


def test_capacity():
    assert moe.capacity(tiny_moe_config(moe_capacity_factor=1.25), 16) == 10  # ceil(1.25 * 16 * 2 / 4)
    assert moe.capacity(tiny_moe_config(moe_capacity_factor=0.01), 16) == 1
    assert moe.capacity(tiny_moe_config(moe_capacity_factor=100.0), 16) == 16
    assert moe.capacity(tiny_moe_config(moe_capacity_factor=None), 16) == 16


@pytest.mark.numerics
@pytest.mark.parametrize("path", ["buffer", "ragged_dot"])  # this CPU's (C = N), GPU's
@pytest.mark.parametrize("shared", [0, 1])
def test_dropless_dispatch_equals_the_dense_reference_with_gradients(monkeypatch, path, shared):
    cfg = tiny_moe_config(moe_capacity_factor=None, moe_shared=shared)
    p, x = layer_params(cfg), inputs()
    bias = jnp.array([0.3, -0.2, 0.0, 0.1])
    y, stats = forced(monkeypatch, path)(cfg, p, x, {"router_bias": bias})
    ref, experts = dense_reference(cfg, p, x, bias)
    ref64, _ = float64_reference(cfg, p, x, bias)
    assert_near_f64(y, ref, ref64, 1, "outputs")
    np.testing.assert_array_equal(stats["load"], np.bincount(np.asarray(experts).ravel(), minlength=X))
    assert float(stats["dropped"]) == 0.0

    # The gradient of sum(sin(y)), both sides given the same cotangent cos(y) (y in float64): from each
    # side's own fp32 y, cos would carry that y's round-off (u |y|, |y| up to ~15) into every gradient.
    cotangent = jnp.asarray(np.cos(ref64), jnp.float32)
    _, grad64 = float64_reference(cfg, p, x, bias, cotangent=cotangent)
    vjp = lambda fn: lambda p, x, g: jax.vjp(fn, p, x)[1](g)
    ours = vjp(lambda p, x: moe.moe_apply(cfg, p, x, {"router_bias": bias})[0])
    theirs = vjp(lambda p, x: dense_reference(cfg, p, x, bias)[0])
    got, want = jax.jit(ours)(p, x, cotangent), jax.jit(theirs)(p, x, cotangent)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    assert jax.tree.structure(grad64) == jax.tree.structure(want)
    leaves = zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want), jax.tree.leaves(grad64))
    for (path, a), b, exact in leaves:  # each leaf at its own scale, there and back
        assert_near_f64(a, b, exact, 2, jax.tree_util.keystr(path))
    assert float(jnp.abs(got[0]["router"]).max()) > 0  # the combine weights train the router


def assert_equals_the_buffer(run, grouped: ModelConfig, p: dict, x, state: dict):
    """`run` (a forced moe_apply) on the dropless `grouped` config against the buffer with C = N (nothing
    drops: the same function): outputs, stats and gradients by the float64 rule (float64_reference the exact
    values)."""
    buffer = grouped.replace(moe_capacity_factor=100.0)  # C = min(ceil(100 N K / X), N) = N
    n = x.shape[0] * x.shape[1]
    assert moe.capacity(buffer, n) == n
    (y, stats), (want, want_stats) = run(grouped, p, x, state), run(buffer, p, x, state)
    jax.tree.map(np.testing.assert_array_equal, stats, want_stats)
    assert float(stats["dropped"]) == 0.0
    ref64, _ = float64_reference(grouped, p, x, state["router_bias"])
    assert_near_f64(y, want, ref64, 1, "outputs")

    cotangent = jnp.asarray(np.cos(ref64), jnp.float32)  # as in the dense test: one cotangent for both
    _, grad64 = float64_reference(grouped, p, x, state["router_bias"], cotangent=cotangent)
    vjp = lambda cfg: jax.jit(lambda p, x, g: jax.vjp(lambda p, x: run(cfg, p, x, state)[0], p, x)[1](g))
    got, want = vjp(grouped)(p, x, cotangent), vjp(buffer)(p, x, cotangent)
    leaves = zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want), jax.tree.leaves(grad64))
    for (path, a), b, exact in leaves:
        assert_near_f64(a, b, exact, 2, jax.tree_util.keystr(path))


def primitives(cfg: ModelConfig, p: dict, x, state: dict) -> str:
    return str(jax.make_jaxpr(lambda p, x: moe.moe_apply(cfg, p, x, state))(p, x))


def test_the_platform_picks_the_dropless_dispatch(monkeypatch):
    """Dropless: megablox's gmm on TPU, ragged_dot on GPU, the buffer with C = N on CPU (this one); a
    capacity factor: the buffer everywhere."""
    dropless, capped = tiny_moe_config(moe_capacity_factor=None), tiny_moe_config(moe_capacity_factor=1.25)
    assert moe.dispatch_path(dropless) == "buffer"
    state = {"router_bias": jnp.zeros(X)}
    assert "ragged_dot" not in primitives(dropless, layer_params(dropless), inputs(), state)
    for platform, path in [("tpu", "gmm"), ("gpu", "ragged_dot"), ("cpu", "buffer")]:
        monkeypatch.setattr(moe, "target_platform", lambda: platform)
        assert (moe.dispatch_path(dropless), moe.dispatch_path(capped)) == (path, "buffer")


@pytest.mark.numerics
@pytest.mark.parametrize("shared", [0, 1])
def test_ragged_dot_dispatch_equals_the_buffer_when_nothing_drops(monkeypatch, shared):
    grouped = tiny_moe_config(moe_capacity_factor=None, moe_shared=shared)
    p, x = layer_params(grouped, seed=5), inputs(seed=6)
    state = {"router_bias": jnp.array([0.3, -0.2, 0.0, 0.1])}
    run = forced(monkeypatch, "ragged_dot")
    assert "ragged_dot" in primitives(grouped, p, x, state)
    assert "ragged_dot" not in primitives(grouped.replace(moe_capacity_factor=100.0), p, x, state)
    assert_equals_the_buffer(run, grouped, p, x, state)


WIDE = dict(hidden_size=128, mlp_dim=128, init_std=0.15)  # D and F in megablox's 128-wide tiles


@pytest.mark.numerics
@pytest.mark.parametrize(
    "rows, bias",
    [
        (9, [0.3, -0.2, 0.0, 0.1]),  # 2 x 9 tokens x 2 picks = 36 rows, padded to one 128-row tile
        (32, [0.0, 0.0, 0.0, -10.0]),  # 128 rows, one whole tile; expert 3 picked by none (an empty group)
    ],
)
def test_gmm_dispatch_equals_the_buffer_when_nothing_drops(monkeypatch, rows, bias):
    """TPU's dispatch: megablox's gmm, and tgmm for the weight gradients, run by Pallas's interpreter."""
    grouped = tiny_moe_config(moe_capacity_factor=None, moe_shared=1, **WIDE)
    p = layer_params(grouped, seed=5)
    x = jax.random.normal(jax.random.PRNGKey(6), (B, rows, grouped.hidden_size))
    state = {"router_bias": jnp.array(bias)}
    run = forced(monkeypatch, "gmm")
    found = primitives(grouped, p, x, state)
    assert "name=gmm" in found and "ragged_dot" not in found
    assert_equals_the_buffer(run, grouped, p, x, state)


@pytest.mark.numerics
def test_gmm_rows_past_the_groups_are_zero_and_pass_no_gradient():
    """`_grouped_matmul`'s contract on megablox's path (interpreted), as ragged_dot's: 40 rows, 25 in groups
    (one empty), padded to a 128-row tile; the 15 past the groups come out zero, as does their gradient,
    and add nothing to the weights'. Widths that do not fill 128-wide tiles (96 in, 200 out) are padded to
    them; float64 takes ragged_dot."""
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    sizes = jnp.array([5, 0, 20], jnp.int32)
    gmm = functools.partial(moe._grouped_matmul, kernel="gmm", interpret=True)
    ragged = functools.partial(moe._grouped_matmul, kernel="ragged_dot")
    for i, o in ((128, 256), (96, 200)):
        x = jax.random.normal(keys[0], (40, i))
        w = jax.random.normal(keys[1], (3, i, o))
        cotangent = jax.random.normal(keys[2], (40, o))
        (y, vjp), (want, want_vjp) = (jax.vjp(lambda x, w: f(x, w, sizes), x, w) for f in (gmm, ragged))
        assert "ragged_dot" not in str(jax.make_jaxpr(gmm)(x, w, sizes))
        assert not np.any(y[25:])
        assert_fp32_close(y, want, 1, "outputs")  # one matmul
        (dx, dw), (want_dx, want_dw) = vjp(cotangent), want_vjp(cotangent)
        assert not np.any(dx[25:])
        assert_fp32_close(dx, want_dx, 1, "input gradient")
        assert_fp32_close(dw, want_dw, 1, "weight gradient")
        assert not np.any(dw[1])  # the empty group's weights
    assert in_float64(lambda x, w: gmm(x, w, sizes), x, w).dtype == np.float64  # megablox: bf16, fp32


@pytest.mark.numerics
def test_capacity_drops_exactly_the_late_assignments():
    cfg = tiny_moe_config(moe_capacity_factor=0.5)  # C = ceil(0.5 * 16 * 2 / 4) = 4 slots per expert
    p, x = layer_params(cfg, seed=3), inputs(seed=4)
    bias = jnp.array([0.4, 0.0, 0.0, -0.4])  # skewed, so some experts overflow
    y, stats = apply(cfg, p, x, {"router_bias": bias})
    _, experts = dense_reference(cfg, p, x, bias)
    keep = kept_assignments(np.asarray(experts), moe.capacity(cfg, B * T))
    assert 0 < (~keep).sum() == float(stats["dropped"])
    np.testing.assert_array_equal(stats["load"], np.bincount(np.asarray(experts).ravel(), minlength=X))
    ref64, _ = float64_reference(cfg, p, x, bias, keep)
    assert_near_f64(y, dense_reference(cfg, p, x, bias, keep)[0], ref64, 1, "outputs")
    # Only tokens that lost an assignment differ from the dropless output (by more than round-off).
    full, _ = apply(cfg.replace(moe_capacity_factor=None), p, x, {"router_bias": bias})
    changed = np.abs(np.asarray(y - full)).reshape(B * T, D).max(-1) > fp32_bound(1, scale_of(full))
    np.testing.assert_array_equal(changed, (~keep).any(-1))


def test_row_capacity_groups_drop_within_each_row():
    """moe_capacity_groups="row" (MaxText's): each row's tokens compete for their own C slots, exactly as
    if each row were its own call; the call's default lets row 0's tokens take row 1's slots."""
    cfg = tiny_moe_config(moe_capacity_factor=0.5, moe_capacity_groups="row")  # C = ceil(0.5 * 8 * 2 / 4) = 2
    p, x = layer_params(cfg, seed=3), inputs(seed=4)
    state = {"router_bias": jnp.array([0.4, 0.0, 0.0, -0.4])}
    y, stats = moe.moe_apply(cfg, p, x, state)
    rows = [moe.moe_apply(cfg.replace(moe_capacity_groups="call"), p, x[i : i + 1], state) for i in range(B)]
    np.testing.assert_array_equal(y, jnp.concatenate([r[0] for r in rows]))
    np.testing.assert_array_equal(stats["load"], sum(r[1]["load"] for r in rows))
    assert float(stats["dropped"]) == sum(float(r[1]["dropped"]) for r in rows) > 0
    whole, _ = moe.moe_apply(cfg.replace(moe_capacity_groups="call"), p, x, state)
    assert not np.array_equal(y, whole)  # C = 4 over the call's 16 tokens drops others
    with pytest.raises(ValueError, match="moe_capacity_groups must be 'call' or 'row', got 'batch'"):
        tiny_moe_config(moe_capacity_groups="batch")


@pytest.mark.slow
@pytest.mark.numerics
def test_routing_picks_distinct_experts_and_the_bias_only_selects():
    cfg = tiny_moe_config()
    p, x = layer_params(cfg), inputs().reshape(B * T, D)
    experts, weights = moe.route(cfg, x, p["router"], jnp.zeros(X))
    assert all(len(set(row)) == K for row in np.asarray(experts).tolist())
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)  # normalised: K = 2 terms, a few u
    scores = jax.nn.sigmoid(x @ p["router"])
    biased, biased_weights = moe.route(cfg, x, p["router"], jnp.array([0.0, 0.0, 0.0, 10.0]))
    assert (np.asarray(biased) == 3).any(-1).all()  # every token now picks expert 3
    picked = np.take_along_axis(np.asarray(scores), np.asarray(biased), axis=-1)
    assert_fp32_close(biased_weights, picked / picked.sum(-1, keepdims=True), 1, "weights")
    # No gradient reaches the bias (it is state, moved only by update_state).
    bias_grad = jax.grad(lambda b: jnp.sum(moe.moe_apply(cfg, p, inputs(), {"router_bias": b})[0]))(
        jnp.zeros(X)
    )
    assert not np.any(bias_grad)


def test_update_state_moves_a_skewed_router_toward_balance():
    cfg = tiny_moe_config(num_layers=1, moe_top_k=1, moe_capacity_factor=None, moe_bias_rate=0.05)
    p = layer_params(cfg)
    p["router"] = p["router"].at[0, 0].set(4.0)  # feature 0 is always 1: expert 0 wins nearly every token
    x = inputs().at[..., 0].set(1.0)
    state = moe.moe_init_state(cfg)
    update = jax.jit(moe.moe_update_state, static_argnums=0)
    imbalance = []
    for _ in range(40):
        _, stats = apply(cfg, p, x, jax.tree.map(lambda a: a[0], state))
        state, metrics = update(cfg, state, jax.tree.map(lambda a: a[None], stats))
        imbalance.append(float(metrics["moe/imbalance"]))
    assert set(metrics) == {"moe/imbalance", "moe/dropped_fraction", *(f"moe/load/e{i}" for i in range(X))}
    assert all(np.ndim(v) == 0 for v in metrics.values())
    assert float(metrics["moe/dropped_fraction"]) == 0.0
    assert abs(sum(float(metrics[f"moe/load/e{i}"]) for i in range(X)) - 1.0) < 1e-6  # fractions: a few u
    assert imbalance[0] > 2.5 and max(imbalance[-5:]) < 0.6 * imbalance[0]
    assert float(state["router_bias"][0, 0]) < 0 < float(state["router_bias"][0, 1:].max())


def test_update_state_metrics_from_summed_stats():
    cfg = tiny_moe_config(moe_bias_rate=0.1)
    stats = {
        "load": jnp.array([[4.0, 2.0, 2.0, 0.0], [2.0, 2.0, 2.0, 2.0]]),
        "dropped": jnp.array([1.0, 0.0]),
    }
    state, metrics = moe.moe_update_state(cfg, moe.moe_init_state(cfg), stats)
    # counted by hand: each value one or two fp32 roundings from these (allclose's 1e-7, approx's 1e-6)
    np.testing.assert_allclose(state["router_bias"], [[-0.1, 0.0, 0.0, 0.1], [0.0, 0.0, 0.0, 0.0]])
    assert float(metrics["moe/imbalance"]) == pytest.approx((2.0 + 1.0) / 2)
    assert float(metrics["moe/dropped_fraction"]) == pytest.approx(1 / 16)
    assert float(metrics["moe/load/e0"]) == pytest.approx((0.5 + 0.25) / 2)


@pytest.mark.parametrize(
    "capacity_factor, path, dims",
    [(1.25, "buffer", {}), (None, "buffer", {}), (None, "ragged_dot", {}), (None, "gmm", WIDE)],
)
def test_bfloat16_runs_and_keeps_its_dtype(monkeypatch, capacity_factor, path, dims):
    cfg = tiny_moe_config(dtype="bfloat16", moe_capacity_factor=capacity_factor, **dims)
    p = jax.tree.map(lambda a: a.astype(jnp.bfloat16), layer_params(cfg))
    x = jax.random.normal(jax.random.PRNGKey(1), (B, T, cfg.hidden_size)).astype(jnp.bfloat16)
    y, stats = forced(monkeypatch, path)(cfg, p, x, {"router_bias": jnp.zeros(X)})
    f32 = lambda tree: jax.tree.map(lambda a: a.astype(jnp.float32), tree)
    ref, _ = dense_reference(cfg, f32(p), f32(x), jnp.zeros(X))
    assert y.dtype == jnp.bfloat16 and stats["load"].dtype == jnp.float32
    assert rel_err(y.astype(jnp.float32), ref) <= 5e-2  # bf16: 2^-8 relative per rounding, not fp32's bound
