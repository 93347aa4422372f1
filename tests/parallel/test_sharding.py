"""Sharded execution on 8 fake CPU devices equals one device; bad meshes and batches fail early."""

import functools

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from t2mlr_jax.architectures.t2mlr.recurrence import jacobi_forward
from t2mlr_jax.config.sections import Mesh
from t2mlr_jax.model.params import init_params, param_axes
from t2mlr_jax.parallel.mesh import check_batch, make_mesh, resolve_mesh_shape
from t2mlr_jax.parallel.placement import param_shardings
from t2mlr_jax.parallel.rules import ZERO_STAGES, partition_spec, weight_partition_spec
from tests.tiny import tiny_config, tiny_params, tokens
from tests.tolerance import assert_fp32_close

# A missing fake-device setup fails loudly instead of skipping the sharding tests.
assert jax.device_count() >= 8, "needs the 8 fake devices of tests/conftest.py"


def test_mesh_shapes_and_errors():
    assert resolve_mesh_shape(-1, 2, 2, 8) == (2, 2, 1, 2)  # (data, fsdp, expert, tensor)
    assert resolve_mesh_shape(1, -1, 2, 8) == (1, 4, 1, 2)
    with pytest.raises(ValueError, match="at most one"):
        resolve_mesh_shape(-1, -1, 1, 8)
    with pytest.raises(ValueError, match="devices"):
        resolve_mesh_shape(3, 1, 1, 8)
    with pytest.raises(ValueError, match="divisible by the data-parallel"):
        check_batch(6, make_mesh(4, 2, 1))
    with pytest.raises(ValueError, match="grad_accum"):
        check_batch(8, make_mesh(8, 1, 1), grad_accum=3)
    with pytest.raises(ValueError, match=r"^mesh.zero must be one of \(1, 3\), got 2$"):
        Mesh(zero=2)


def test_rules_shard_what_divides_and_replicate_the_rest():
    mesh = make_mesh(2, 2, 2)
    assert partition_spec(("layers", "embed", "heads", "head_dim"), (4, 32, 4, 8), mesh) == P(
        None, "fsdp", "tensor", None
    )
    assert partition_spec(("layers", "embed", "kv_heads", "head_dim"), (4, 32, 3, 8), mesh) == P(
        None, "fsdp", None, None
    )
    assert partition_spec(("batch", "length"), (8, 16), mesh) == P(("data", "fsdp"), None)
    with pytest.raises(ValueError, match="no rule"):
        partition_spec(("nonsense",), (4,), mesh)


def test_a_weight_whose_width_fsdp_does_not_divide_splits_another_dimension():
    """A 36-wide weight on fsdp:8 (as the 584-wide baseline on fsdp:16) splits its MLP columns (beside
    their tensor axis where both divide) or its heads; a norm stays whole; ZeRO-1's optimizer state goes
    over data and fsdp, each on the first dimension it divides."""
    mlp, attn = ("layers", "embed", "mlp"), ("layers", "embed", "heads", "head_dim")
    assert weight_partition_spec(mlp, (4, 36, 64), make_mesh(1, 8, 1)) == P(None, None, "fsdp")
    assert weight_partition_spec(mlp, (4, 38, 64), make_mesh(1, 4, 2)) == P(None, None, ("tensor", "fsdp"))
    assert weight_partition_spec(attn, (4, 36, 8, 8), make_mesh(1, 8, 1)) == P(None, None, "fsdp", None)
    assert weight_partition_spec(("layers", "norm"), (4, 36), make_mesh(1, 8, 1)) == P(None, None)
    assert weight_partition_spec(("layers", "head_dim"), (4, 16), make_mesh(1, 8, 1)) == P(None, None)
    zero1 = ZERO_STAGES[1]
    assert weight_partition_spec(attn, (4, 36, 4, 8), make_mesh(2, 4, 1), zero1.weights) == P(
        None, None, None, None
    )
    assert weight_partition_spec(attn, (4, 36, 4, 8), make_mesh(2, 4, 1), zero1.optimizer_state) == P(
        None, "data", "fsdp", None
    )


CFG = tiny_config()
# One jitted function for every mesh below (each input sharding compiles its own program); the one-device
# reference it gives is computed once.
jacobi_loss_and_grad = jax.jit(
    jax.value_and_grad(lambda p, t: jacobi_forward(CFG, p, t, d_forward=4, d_backward=2).logits.std())
)


@functools.cache
def one_device_reference():
    params, toks = tiny_params(CFG, gamma=0.8), tokens(8, 8)
    return params, toks, jacobi_loss_and_grad(params, toks)


@pytest.mark.slow
@pytest.mark.numerics
@pytest.mark.parametrize("shape", [(8, 1, 1), (2, 2, 2), (1, 4, 2)])
def test_sharded_jacobi_forward_and_grad_equal_one_device(shape):
    params, toks, (ref_loss, ref_grad) = one_device_reference()
    mesh = make_mesh(*shape)
    with jax.set_mesh(mesh):
        sharded = jax.device_put(params, param_shardings(param_axes(CFG), params, mesh))
        toks_s = jax.device_put(
            toks, NamedSharding(mesh, partition_spec(("batch", "length"), toks.shape, mesh))
        )
        loss, grad = jacobi_loss_and_grad(sharded, toks_s)
    # D = 4 passes over the 2 recurrent layers and the 2 others; the gradient runs the path back again
    depth = 4 * 2 + 2
    assert_fp32_close(loss, ref_loss, depth, "loss")
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(grad), jax.tree.leaves(ref_grad)):
        assert_fp32_close(a, b, 2 * depth, f"gradient {jax.tree_util.keystr(path)}")


def test_sharded_init_matches_host_init_and_is_sharded():
    cfg = tiny_config()
    mesh = make_mesh(2, 2, 2)
    init = lambda key: init_params(cfg, key)
    shardings = param_shardings(param_axes(cfg), jax.eval_shape(init, jax.random.PRNGKey(0)), mesh)
    sharded = jax.jit(init, out_shardings=shardings)(jax.random.PRNGKey(0))
    host = tiny_params(cfg)
    q = sharded["layers"]["self_attn"]["q_proj"]
    assert q.sharding.spec == P(None, "fsdp", "tensor", None)
    assert q.addressable_shards[0].data.shape == (4, 16, 2, 8)
    for a, b in zip(jax.tree.leaves(sharded), jax.tree.leaves(host)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)  # same draws; jit may fuse the scaling
