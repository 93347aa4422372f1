"""Expert parallelism on 8 fake CPU devices: the MoE MLP with its params sharded by their logical axes (the
experts over the mesh's `expert` axis) equals one device, gradients included; the mesh checks for it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from t2mlr_jax.model import moe
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.spec import init_from_specs, spec_axes
from t2mlr_jax.parallel.mesh import check_batch, check_experts, make_mesh, resolve_mesh_shape
from t2mlr_jax.parallel.placement import batch_sharding
from t2mlr_jax.parallel.rules import RESIDUAL_AXES, named_sharding, partition_spec, tree_shardings
from tests.tolerance import assert_near_f64, in_float64

# A missing fake-device setup fails loudly instead of skipping the sharding tests.
assert jax.device_count() >= 8, "needs the 8 fake devices of tests/conftest.py"

CFG = ModelConfig(
    vocab_size=32,
    hidden_size=32,
    num_layers=2,
    num_heads=2,
    num_kv_heads=2,
    head_dim=8,
    mlp_dim=16,
    mlp="moe",
    moe_experts=8,
    moe_top_k=2,
    init_std=0.3,
).validate()


def loss_and_grad(params, x, bias):
    def loss(params, x):
        y, stats = moe.moe_apply(CFG, jax.tree.map(lambda a: a[1], params), x, {"router_bias": bias})
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
    fn = jax.jit(loss_and_grad)
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
    (exact_loss, (exact_y, _)), exact_grad = in_float64(loss_and_grad, params, x, bias)
    assert_near_f64(y, ref_y, exact_y, 1, "outputs")  # one MoE layer
    assert_near_f64(loss, ref_loss, exact_loss, 1, "loss", scale=float(np.abs(np.sin(exact_y)).sum()))
    np.testing.assert_array_equal(stats["load"], ref_stats["load"])
    assert float(stats["dropped"]) == float(ref_stats["dropped"])
    for (path, a), b, c in zip(
        jax.tree_util.tree_leaves_with_path(grad), jax.tree.leaves(ref_grad), jax.tree.leaves(exact_grad)
    ):
        assert_near_f64(a, b, c, 2, f"gradient {jax.tree_util.keystr(path)}")  # the layer and back


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
