"""Real TPU compiles from this CPU (libtpu, no TPU): a tiny T²MLR and a tiny LRT train step built as the
trainer builds them (train/programs.py) on v5e 2x2 meshes, with attention by the Pallas splash kernel
under shard_map, each device holding its shard of the state, and the collectives of ZeRO-3 (weights
gathered a layer at a time, gradients reduce-scattered) and of expert parallelism (experts stay, tokens
travel). Also: kernel choices read the platform the program is compiled for, not the host's."""

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
from t2mlr_jax.parallel.hlo import executed, kernels, parse
from t2mlr_jax.parallel.hlo_collectives import collectives
from t2mlr_jax.parallel.mesh import target_platform
from t2mlr_jax.train import aot
from t2mlr_jax.train.programs import Programs

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("tpu_compile")]  # one worker compiles the fixture

SPLASH = {"splash_mha_fwd_residuals", "splash_mha_dq_no_residuals", "splash_mha_dkv_no_residuals"}
TINY = {  # dims that tile the TPU's (8, 128) layout, none a token count (weights and activations apart)
    "model.hidden_size": 384,
    "model.num_heads": 4,
    "model.num_kv_heads": 2,
    "model.head_dim": 128,
    "model.mlp_dim": 768,
    "model.num_layers": 4,
    "model.dtype": "bfloat16",
}
SEQ = 128  # one splash block
BATCH = 8  # rows: no [B, T, D] activation shaped as a weight
MESHES = {"t2mlr": "fsdp:4", "lrt": "fsdp:2,expert:2"}


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
        fn, args = programs.train_program(BATCH, SEQ)
        with jax.set_mesh(programs.mesh):
            out[arch] = programs, fn.trace(*args).lower().compile(), args
    return out


def shard_bytes(tree, tiled: bool = False) -> int:
    """Bytes each device holds of an abstract tree, by its shardings; `tiled`: at most, laid out in TPU
    memory tiles (the minor dimension in 128s, the next in (32 / bytes per element)s, a vector in 1024s)."""

    def size(x) -> int:
        shape = list(x.sharding.shard_shape(x.shape)) or [1]
        if tiled:
            shape[-1] = -(-shape[-1] // (128 if len(shape) > 1 else 1024)) * (128 if len(shape) > 1 else 1024)
            if len(shape) > 1:
                rows = 32 // x.dtype.itemsize
                shape[-2] = -(-shape[-2] // rows) * rows
        return int(np.prod(shape)) * x.dtype.itemsize

    return sum(size(x) for x in jax.tree.leaves(tree))


@pytest.mark.parametrize("arch", ["t2mlr", "lrt"])
def test_attention_is_the_splash_kernel(compiled, arch):
    _, step, _ = compiled[arch]
    assert SPLASH <= set(kernels(step.as_text())), kernels(step.as_text())


@pytest.mark.parametrize("arch", ["t2mlr", "lrt"])
def test_each_device_holds_its_shard_of_the_state(compiled, arch):
    programs, step, (state, batch) = compiled[arch]
    whole = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state.params))
    assert shard_bytes(state.params) < whole / 2  # over fsdp (and expert): only norms and gates replicated
    # what the compiled step takes per device is the state's and the batch's shards, each laid out in the
    # TPU's memory tiles; the new state reuses the old one's buffers (donated)
    memory = memory_per_device(step)
    assert shard_bytes((state, batch)) <= memory["argument_bytes"] <= shard_bytes((state, batch), tiled=True)
    donated = shard_bytes((state.params, state.opt_state))
    assert donated <= memory["alias_bytes"] <= shard_bytes(state, tiled=True)


def collective_bytes(programs: Programs, step, kind: str) -> list[float]:
    """Result bytes of each of the step's `kind` collectives (as parallel.hlo_collectives reads them: a
    TPU reduce-scatter is an all-reduce in an `all-reduce-scatter` fusion)."""
    runs, _ = executed(parse(step.as_text()))
    return [c.result_bytes for c in collectives(runs, programs.mesh.size) if c.kind == kind]


def layer_weights(programs: Programs) -> list[float]:
    """Whole bytes of each weight as one use of it holds it: a stacked layer parameter's one layer."""
    shapes = jax.tree_util.tree_flatten_with_path(programs.state_shapes.params)[0]
    stacked = lambda path: any(getattr(k, "key", None) == "layers" for k in path)
    return [(x.size // (x.shape[0] if stacked(path) else 1)) * x.dtype.itemsize for path, x in shapes]


def test_fsdp_gathers_a_layer_at_a_time_and_scatters_its_gradients(compiled):
    """ZeRO-3 as it should compile: a weight is gathered where a layer uses it (never a whole stack of
    layers at once), and gradients are reduce-scattered to their shards, where the update runs: no
    all-reduce of a gradient."""
    programs, step, _ = compiled["t2mlr"]
    gathered = collective_bytes(programs, step, "all-gather")
    assert gathered and max(gathered) <= max(layer_weights(programs))
    assert collective_bytes(programs, step, "reduce-scatter")
    assert max(collective_bytes(programs, step, "all-reduce"), default=0) < 64 * 1024  # scalars: loss, norms


def test_expert_weights_stay_on_their_devices(compiled):
    """Each device keeps its experts: what it gathers of an MoE weight is at most its own experts' share
    (fsdp's), never every expert's; tokens travel to the experts instead (all-to-all)."""
    programs, step, _ = compiled["lrt"]
    specs = jax.tree.leaves(programs.arch.specs, is_leaf=lambda x: hasattr(x, "axes"))
    shapes = jax.tree.leaves(programs.state_shapes.params)
    # one layer's every expert of an MoE weight [L, experts, ...]
    experts = [
        x.size // x.shape[0] * x.dtype.itemsize for x, spec in zip(shapes, specs) if "experts" in spec.axes
    ]
    assert experts
    assert not set(collective_bytes(programs, step, "all-gather")) & set(experts)
    assert collective_bytes(programs, step, "all-to-all")


def test_kernels_follow_the_platform_compiled_for(compiled):
    """_sum_last's product with ones is XLA:CPU's fast reduction: a TPU program gets the plain reduce,
    and "auto" attention on a TPU mesh is splash while on this CPU it is the einsum reference."""
    programs, _, _ = compiled["t2mlr"]
    x = jnp.ones((4, 256), jnp.float32)
    q, kv = jnp.ones((4, SEQ, 4, 128), jnp.bfloat16), jnp.ones((4, SEQ, 2, 128), jnp.bfloat16)
    assert target_platform() == "cpu"
    assert "dot_general" in str(jax.make_jaxpr(layers._sum_last)(x))
    with jax.set_mesh(programs.mesh):
        assert target_platform() == "tpu"
        jaxpr = str(jax.make_jaxpr(layers._sum_last)(x))
        assert "reduce_sum" in jaxpr and "dot_general" not in jaxpr
        assert layers.attention_path("auto", q, kv, None) == "pallas"
    assert layers.attention_path("auto", q, kv, None) == "einsum"


def test_a_bad_topology_or_mesh_is_one_line_naming_it():
    with pytest.raises(ValueError, match=r"^TPU topology 'v9z:2x2': .*\(e\.g\. v5e:2x2"):
        aot.topology_mesh("v9z:2x2", "fsdp:4")
    with pytest.raises(
        ValueError, match=r"--mesh='fsdp:3' on v5e:2x2 \(4 chips\): .*3 but there are 4 devices"
    ):
        aot.topology_mesh("v5e:2x2", "fsdp:3")
    with pytest.raises(ValueError, match=re.escape("'pipe:2' is not <axis>:<size>")):
        aot.parse_mesh("pipe:2")
