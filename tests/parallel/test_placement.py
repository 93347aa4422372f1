"""Every architecture's parameters are placed from its parameter table: under a data x fsdp x tensor mesh
of 8 fake devices the large matrices of each baseline are actually sharded, and a parameter without a spec
is an error, never a silently replicated model."""

import jax
import jax.numpy as jnp
import pytest

from t2mlr_jax.architectures import ARCHITECTURES
from t2mlr_jax.experiment import resolve
from t2mlr_jax.model.spec import spec_axes, spec_leaves
from t2mlr_jax.parallel.mesh import make_mesh
from t2mlr_jax.parallel.placement import param_shardings
from t2mlr_jax.train.trainer import Run
from tests.tiny import tiny_experiment
from tests.train.tiny_task import tiny_source

# A missing fake-device setup fails loudly instead of skipping the sharding tests.
assert jax.device_count() >= 8, "needs the 8 fake devices of tests/conftest.py"
BUILT_IN = ("t2mlr", "transformer", "looped", "middle_looped", "pause", "lstm")


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_large_matrix_of_every_architecture_is_sharded(tmp_path, name):
    config = tiny_experiment(name)
    config.mesh.update(data=2, fsdp=2, tensor=2)
    config.looped.update(start=1, end=1)
    run = Run(resolve(config), tmp_path, tiny_source(), name)
    flat = jax.tree_util.tree_flatten_with_path(run.state_shardings.params)[0]
    shardings = {tuple(k.key for k in path): sharding for path, sharding in flat}
    large = {
        p: s for p, s in spec_leaves(run.arch.specs).items() if s.kind in ("matrix", "embedding", "head")
    }
    assert large
    for path, spec in large.items():
        if spec.shape[-1] >= 16:
            sharding = shardings[path]
            assert not sharding.is_fully_replicated, f"{name}: {'/'.join(path)} is replicated"


def test_every_architecture_is_registered_and_tested_here():
    assert set(BUILT_IN) <= set(ARCHITECTURES.names())


def test_a_parameter_without_a_spec_is_an_error():
    arch = ARCHITECTURES.get("transformer").build(resolve(tiny_experiment("transformer")))
    shapes = {
        **jax.eval_shape(arch.init, jax.random.PRNGKey(0)),
        "stray": jax.ShapeDtypeStruct((4,), jnp.float32),
    }
    with pytest.raises(ValueError, match=r"no spec for \[\"\['stray'\]\"\]"):
        param_shardings(spec_axes(arch.specs), shapes, make_mesh(data=2, fsdp=2, tensor=2))
