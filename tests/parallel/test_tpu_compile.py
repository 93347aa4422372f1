"""Real TPU compiles from this CPU (libtpu, no TPU): a tiny T²MLR and a tiny LRT train step built as the
trainer builds them (train/programs.py) on a v5e 2x2 mesh, with attention by the Pallas splash kernel
under shard_map, parameters and optimizer state sharded as the rule table says, and the collectives fsdp
and tensor parallelism call for, not a gathered full weight. Also: kernel choices read the platform the
program is compiled for, not the host's."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2mlr_jax.architectures import build_architecture
from t2mlr_jax.config.edit import config_module
from t2mlr_jax.experiment import resolve
from t2mlr_jax.model import layers
from t2mlr_jax.parallel.compiled_report import memory_per_device
from t2mlr_jax.parallel.hlo_collectives import ARRAY, kernels, parse
from t2mlr_jax.parallel.mesh import target_platform
from t2mlr_jax.train import aot
from t2mlr_jax.train.programs import Programs

pytestmark = pytest.mark.slow

SPLASH = {"splash_mha_fwd_residuals", "splash_mha_dq_no_residuals", "splash_mha_dkv_no_residuals"}
TINY = {  # dims that tile the TPU's (8, 128) layout, so that no parameter is padded in HBM
    "model.hidden_size": 256,
    "model.num_heads": 4,
    "model.num_kv_heads": 2,
    "model.head_dim": 128,
    "model.mlp_dim": 512,
    "model.num_layers": 4,
    "model.dtype": "bfloat16",
}
SEQ = 128  # one splash block
MESHES = {"t2mlr": "fsdp:2,tensor:2", "lrt": "fsdp:2,expert:2"}


def tiny(config_file: str, arch: str):
    c = config_module(config_file).get_config("cpu")
    for path, value in TINY.items():
        section, field = path.split(".")
        setattr(c[section], field, value)
    c.arch = arch
    return resolve(c)


@pytest.fixture(scope="module")
def compiled():
    """{arch: (Programs, the compiled train step, its abstract args)} on v5e:2x2."""
    out = {}
    for arch, config_file in (("t2mlr", "configs/smollm135m_t2mlr.py"), ("lrt", "configs/lrt_nanochat.py")):
        config = tiny(config_file, arch)
        programs = Programs(
            config, build_architecture(config, arch), aot.topology_mesh("v5e:2x2", MESHES[arch])
        )
        fn, args = programs.train_program(4, SEQ)
        with jax.set_mesh(programs.mesh):
            out[arch] = programs, fn.trace(*args).lower().compile(), args
    return out


def shard_bytes(tree) -> int:
    """Bytes each device holds of an abstract tree, by its shardings."""
    leaves = jax.tree.leaves(tree)
    return sum(int(np.prod(x.sharding.shard_shape(x.shape))) * x.dtype.itemsize for x in leaves)


@pytest.mark.parametrize("arch", ["t2mlr", "lrt"])
def test_attention_is_the_splash_kernel(compiled, arch):
    _, step, _ = compiled[arch]
    assert SPLASH <= set(kernels(step.as_text())), kernels(step.as_text())


@pytest.mark.parametrize("arch", ["t2mlr", "lrt"])
def test_each_device_holds_its_shard_of_the_state(compiled, arch):
    programs, step, (state, batch) = compiled[arch]
    whole = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state.params))
    params = shard_bytes(state.params)
    assert params < whole / 2  # sharded: over fsdp (and tensor / expert), only norms and gates replicated
    # what the compiled step takes per device is exactly the state's and the batch's shards
    assert memory_per_device(step)["argument_bytes"] == shard_bytes((state, batch))
    donated = memory_per_device(step)["alias_bytes"]
    assert donated == shard_bytes(state) - shard_bytes(state.step) - shard_bytes(state.rng)


def full_weights(programs: Programs, axis: str) -> set[tuple[int, ...]]:
    """Global shapes of the matrices the rule table shards over mesh `axis`."""
    shardings = programs.state_shardings.params
    shapes = programs.state_shapes.params
    return {
        tuple(s.shape)
        for s, sh in zip(jax.tree.leaves(shapes), jax.tree.leaves(shardings))
        if s.ndim >= 2 and any(axis in (a if isinstance(a, tuple) else (a,)) for a in sh.spec if a)
    }


def gathered_shapes(hlo: str) -> set[tuple[int, ...]]:
    computations, _ = parse(hlo)
    return {
        tuple(int(d) for d in dims.split(",") if d)
        for c in computations.values()
        for i in c.instructions.values()
        if i.opcode.startswith("all-gather")
        for _, dims in ARRAY.findall(i.type)
    }


def test_tensor_parallel_weights_are_never_gathered_whole(compiled):
    """fsdp gathers a weight's fsdp shards for a layer's matmul; a weight split over `tensor` stays split
    (its heads / MLP columns computed where they lie), so no all-gather yields a whole one."""
    programs, step, _ = compiled["t2mlr"]
    tensor_sharded = full_weights(programs, "tensor")
    assert len(tensor_sharded) >= 4  # q / k / v / o, the MLP
    gathered = gathered_shapes(step.as_text())
    assert gathered, "fsdp gathers the weights' shards"
    stacked_layer = {shape[1:] for shape in tensor_sharded}  # a scanned layer's slice of the stack
    assert not gathered & (tensor_sharded | stacked_layer), sorted(
        gathered & (tensor_sharded | stacked_layer)
    )


def test_expert_weights_stay_on_their_devices(compiled):
    programs, step, _ = compiled["lrt"]
    experts = full_weights(programs, "expert")
    assert experts
    gathered = gathered_shapes(step.as_text())
    assert not gathered & (experts | {shape[1:] for shape in experts})
    assert "all-to-all" in step.as_text()  # tokens travel to their experts instead


def test_kernels_follow_the_platform_compiled_for(compiled):
    """_sum_last's product with ones is XLA:CPU's fast reduction: a TPU program gets the plain reduce,
    and "auto" attention on a TPU mesh is splash while on this CPU it is the einsum reference."""
    programs, _, _ = compiled["t2mlr"]
    x = jnp.ones((4, 256), jnp.float32)
    assert target_platform() == "cpu"
    assert "dot_general" in str(jax.make_jaxpr(layers._sum_last)(x))
    with jax.set_mesh(programs.mesh):
        assert target_platform() == "tpu"
        jaxpr = str(jax.make_jaxpr(layers._sum_last)(x))
        assert "reduce_sum" in jaxpr and "dot_general" not in jaxpr
        q = jnp.ones((4, SEQ, 4, 128), jnp.bfloat16)
        assert layers.attention_path("auto", q, q[:, :, :2], None) == "pallas"
    assert layers.attention_path("auto", q, q[:, :, :2], None) == "einsum"


def test_a_bad_topology_or_mesh_is_one_line_naming_it():
    with pytest.raises(ValueError, match=r"^--topology='v9z:2x2': .*\(e\.g\. v5e:2x2"):
        aot.topology_mesh("v9z:2x2", "fsdp:4")
    with pytest.raises(
        ValueError, match=r"--mesh='fsdp:3' on v5e:2x2 \(4 chips\): .*3 but there are 4 devices"
    ):
        aot.topology_mesh("v5e:2x2", "fsdp:3")
    with pytest.raises(ValueError, match=re.escape("'pipe:2' is not <axis>:<size>")):
        aot.parse_mesh("pipe:2")
