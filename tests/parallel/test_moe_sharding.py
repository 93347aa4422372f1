"""Expert parallelism on 8 fake CPU devices: the MoE MLP with its params sharded by their logical axes (the
experts over the mesh's `expert` axis) equals one device, gradients included, through the capacity buffer
and through the dropless grouped matmuls (each device its experts); the mesh checks for it. And the
dropless MoE compiled for a TPU v5e 2x2 (libtpu, no TPU) runs megablox's kernels."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from t2mlr_jax.model import moe
from t2mlr_jax.model.spec import init_from_specs, spec_axes
from t2mlr_jax.parallel.hlo import dims, executed, kernels, parse
from t2mlr_jax.parallel.hlo_flops import kernel_flops
from t2mlr_jax.parallel.mesh import check_batch, check_experts, make_mesh, resolve_mesh_shape
from t2mlr_jax.parallel.placement import batch_sharding
from t2mlr_jax.parallel.rules import RESIDUAL_AXES, named_sharding, partition_spec, tree_shardings
from t2mlr_jax.train import aot
from tests.tiny import tiny_moe_config
from tests.tolerance import assert_near_f64, in_float64

# A missing fake-device setup fails loudly instead of skipping the sharding tests.
assert jax.device_count() >= 8, "needs the 8 fake devices of tests/conftest.py"

CFG = tiny_moe_config(mlp_dim=16, moe_experts=8)


def loss_and_grad(cfg, params, x, bias):
    def loss(params, x):
        y, stats = moe.moe_apply(cfg, jax.tree.map(lambda a: a[1], params), x, {"router_bias": bias})
        return jnp.sum(jnp.sin(y)), (y, stats)

    return jax.value_and_grad(loss, has_aux=True)(params, x)


@pytest.mark.slow
@pytest.mark.numerics
@pytest.mark.parametrize("mesh_sizes", [dict(data=2, expert=2, tensor=2), dict(fsdp=2, expert=4)])
def test_expert_parallel_apply_and_grad_equal_one_device(mesh_sizes):
    specs = moe.moe_specs(CFG)
    params = init_from_specs(specs, jax.random.PRNGKey(0), "float32")
    x = jax.random.normal(jax.random.PRNGKey(1), (8, 4, CFG.hidden_size))
    bias = jnp.linspace(-0.2, 0.2, CFG.moe_experts)
    fn = jax.jit(functools.partial(loss_and_grad, CFG))
    (ref_loss, (ref_y, ref_stats)), ref_grad = fn(params, x, bias)
    mesh = make_mesh(**mesh_sizes)
    with jax.set_mesh(mesh):
        sharded = jax.device_put(params, tree_shardings(spec_axes(specs), params, mesh))
        up = sharded["up_proj"].sharding.spec
        assert (
            up[1] == "expert"
            and sharded["up_proj"].addressable_shards[0].data.shape[1] == 8 // mesh.shape["expert"]
        )
        x_s = jax.device_put(x, named_sharding(RESIDUAL_AXES, x.shape, mesh))
        (loss, (y, stats)), grad = fn(sharded, x_s, bias)
    # The float64 rule against the same function in float64: a weight's gradient sums over the batch's tokens
    # routed to its expert, so the sharded sum (another order) is as far from the exact one as one
    # device's, not within one block's round-off of the largest gradient.
    (exact_loss, (exact_y, _)), exact_grad = in_float64(
        functools.partial(loss_and_grad, CFG), params, x, bias
    )
    assert_near_f64(y, ref_y, exact_y, 1, "outputs")  # one MoE layer
    assert_near_f64(loss, ref_loss, exact_loss, 1, "loss", scale=float(np.abs(np.sin(exact_y)).sum()))
    np.testing.assert_array_equal(stats["load"], ref_stats["load"])
    assert float(stats["dropped"]) == float(ref_stats["dropped"])
    for (path, a), b, c in zip(
        jax.tree_util.tree_leaves_with_path(grad), jax.tree.leaves(ref_grad), jax.tree.leaves(exact_grad)
    ):
        assert_near_f64(a, b, c, 2, f"gradient {jax.tree_util.keystr(path)}")  # the layer and back


def grouped_weights(jaxpr) -> list[tuple[int, ...]]:
    """The weight shapes of every grouped matmul (ragged_dot, megablox's gmm) in a jaxpr, shard_map bodies
    included (per device there)."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "ragged_dot_general" or eqn.params.get("name") == "gmm":
            found.append(eqn.invars[1].aval.shape)
        for value in eqn.params.values():
            inner = getattr(value, "jaxpr", value)  # a ClosedJaxpr's jaxpr, or a Jaxpr
            if hasattr(inner, "eqns"):
                found += grouped_weights(inner)
    return found


@pytest.mark.slow
@pytest.mark.numerics
@pytest.mark.parametrize(
    "kernel, mesh_sizes, rows",
    [
        ("ragged_dot", dict(data=2, expert=2, tensor=2), 8),  # tokens over data x expert: peers gather
        ("ragged_dot", dict(fsdp=2, expert=4), 8),
        ("ragged_dot", dict(expert=4, tensor=2), 1),  # one row (decoding): the expert peers share tokens
        ("gmm", dict(fsdp=2, expert=4), 8),  # D, F in megablox's 128s; run by Pallas's interpreter
    ],
)
def test_grouped_dispatch_runs_each_devices_experts_and_equals_one_device(
    monkeypatch, kernel, mesh_sizes, rows
):
    """Dropless, each device runs the grouped matmul (GPU's ragged_dot, TPU's gmm: forced, this CPU's own
    dispatch is the buffer) on its X/E experts (and its F/tensor columns); outputs, stats and gradients equal
    one device's capacity buffer with C = N (nothing drops) to the float64 rule."""
    base = CFG.replace(hidden_size=128, mlp_dim=128, init_std=0.15) if kernel == "gmm" else CFG
    grouped = base.replace(moe_capacity_factor=None)
    buffer = base.replace(moe_capacity_factor=100.0)  # C = N
    monkeypatch.setattr(moe, "dispatch_path", lambda cfg: "buffer" if cfg.moe_capacity_factor else kernel)
    if kernel == "gmm":
        monkeypatch.setattr(moe, "_grouped_matmul", functools.partial(moe._grouped_matmul, interpret=True))
    specs = moe.moe_specs(grouped)
    params = init_from_specs(specs, jax.random.PRNGKey(0), "float32")
    d = base.hidden_size
    x = jax.random.normal(jax.random.PRNGKey(1), (rows, 4, d))
    bias = jnp.linspace(-0.2, 0.2, base.moe_experts)
    (ref_loss, (ref_y, ref_stats)), ref_grad = jax.jit(functools.partial(loss_and_grad, buffer))(
        params, x, bias
    )
    fn = functools.partial(loss_and_grad, grouped)
    mesh = make_mesh(**mesh_sizes)
    with jax.set_mesh(mesh):
        sharded = jax.device_put(params, tree_shardings(spec_axes(specs), params, mesh))
        x_s = jax.device_put(x, named_sharding(RESIDUAL_AXES, x.shape, mesh))
        e, f = base.moe_experts // mesh.shape["expert"], base.expert_dim // mesh.shape["tensor"]
        layer = lambda p, x: moe.moe_apply(grouped, jax.tree.map(lambda a: a[1], p), x, {"router_bias": bias})
        forward = jax.make_jaxpr(layer)(sharded, x_s).jaxpr
        assert grouped_weights(forward) == [(e, d, f), (e, f, d)]  # up, down
        assert (kernel == "gmm") == ("name=gmm" in str(forward))
        (loss, (y, stats)), grad = jax.jit(fn)(sharded, x_s, bias)
    (exact_loss, (exact_y, _)), exact_grad = in_float64(fn, params, x, bias)  # float64: ragged_dot
    assert_near_f64(y, ref_y, exact_y, 1, "outputs")
    assert_near_f64(loss, ref_loss, exact_loss, 1, "loss", scale=float(np.abs(np.sin(exact_y)).sum()))
    jax.tree.map(np.testing.assert_array_equal, stats, ref_stats)
    for (path, a), b, c in zip(
        jax.tree_util.tree_leaves_with_path(grad), jax.tree.leaves(ref_grad), jax.tree.leaves(exact_grad)
    ):
        assert_near_f64(a, b, c, 2, f"gradient {jax.tree_util.keystr(path)}")


@pytest.mark.slow
def test_tpu_dropless_moe_runs_megablox_and_no_dense_weight_gradient():
    """The dropless MoE's loss gradient compiled for v5e:2x2 on fsdp:2 x expert:2: the dispatch reads the
    mesh's platform (TPU, from this CPU); gmm runs both projections and their input gradients, tgmm their
    weight gradients, and no convolution takes the X/E local experts' copies of the m assignment rows (what
    libtpu makes of ragged_dot's weight gradient: [X/E, m, D] operands, X/E times the work); kernel_flops
    counts the six kernels, 2 m D F each, per device."""
    cfg = CFG.replace(hidden_size=128, mlp_dim=128, moe_capacity_factor=None)
    mesh = aot.topology_mesh("v5e:2x2", "fsdp:2,expert:2")
    specs = moe.moe_specs(cfg)
    shapes = jax.eval_shape(lambda: init_from_specs(specs, jax.random.PRNGKey(0), "bfloat16"))
    shardings = tree_shardings(spec_axes(specs), shapes, mesh)
    params = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), shapes, shardings)
    shape = (8, 64, cfg.hidden_size)
    x = jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=named_sharding(RESIDUAL_AXES, shape, mesh))
    bias = jax.ShapeDtypeStruct((cfg.moe_experts,), jnp.float32)

    def loss(params, x, bias):
        y, _ = moe.moe_apply(cfg, jax.tree.map(lambda a: a[1], params), x, {"router_bias": bias})
        return jnp.sum(y.astype(jnp.float32) ** 2)

    with jax.set_mesh(mesh):
        assert moe.dispatch_path(cfg) == "gmm"
        text = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(params, x, bias).compile().as_text()
    assert kernels(text) == {"gmm": 4, "tgmm": 2}
    runs, _ = executed(parse(text))
    e = cfg.moe_experts // 2
    m = 8 * 64 * cfg.moe_top_k // 2  # a device's 2 rows and its expert peer's: 512, whole 128-row tiles
    operands = [
        dims(run.computation.instructions[name].type)
        for run in runs
        if run.instruction.opcode == "convolution"
        for name in run.instruction.operands
    ]
    assert operands and max(map(math.prod, operands)) < e * m * cfg.hidden_size
    assert kernel_flops(runs) == 6 * 2 * m * cfg.hidden_size * cfg.expert_dim


def test_expert_axis_rules_and_checks():
    assert resolve_mesh_shape(-1, 1, 2, 8, expert=2) == (2, 1, 2, 2)
    assert resolve_mesh_shape(1, 1, 1, 8, expert=-1) == (1, 1, 8, 1)
    mesh = make_mesh(data=2, expert=2, tensor=2)
    assert mesh.axis_names == ("data", "fsdp", "expert", "tensor")
    assert partition_spec(moe.EXPERT_BUFFER_AXES, (1, 8, 5, 32), mesh) == P(None, "expert", None, None)
    assert partition_spec(moe.EXPERT_BUFFER_AXES, (4, 8, 5, 32), mesh) == P("data", "expert", None, None)
    assert partition_spec(("batch", "length"), (8, 16), mesh) == P(("data", "expert"), None)
    assert batch_sharding(mesh) == NamedSharding(mesh, P(("data", "fsdp", "expert")))
    with pytest.raises(ValueError, match=r"data\*fsdp\*expert = 8"):
        check_batch(4, make_mesh(data=2, expert=4))
    check_experts(8, mesh)
    check_experts(3, make_mesh(data=8))  # expert=1: any number of experts
    with pytest.raises(ValueError, match=r"moe_experts \(8\) is not divisible by .* mesh.expert = 3"):
        check_experts(8, make_mesh(data=2, expert=3, devices=jax.devices()[:6]))
