"""Real TPU compiles from this CPU (libtpu, no TPU): a tiny T²MLR and a tiny LRT train step built as the
trainer builds them (train/programs.py) on v5e 2x2 meshes, with attention by the Pallas splash kernel
under shard_map, each device holding its shard of the state, and the collectives of ZeRO-3 (weights
gathered a layer at a time, gradients reduce-scattered), of ZeRO-1 (weights whole, gradients
reduce-scattered to the optimizer state's shards, the new weights gathered once) and of expert parallelism
(experts stay, tokens travel). Also: kernel choices read the platform the program is compiled for, not the
host's."""

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
from t2mlr_jax.parallel.hlo import dims, executed, kernels, parse
from t2mlr_jax.parallel.hlo_collectives import collectives
from t2mlr_jax.parallel.mesh import target_platform
from t2mlr_jax.train import aot
from t2mlr_jax.train.programs import Programs

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("tpu_compile")]  # one worker compiles the fixture

SPLASH = {  # the kernels with segment ids (the documents)
    "splash_mha_fwd_segmented_residuals",
    "splash_mha_dq_segmented_no_residuals",
    "splash_mha_dkv_segmented_no_residuals",
}
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
# name: (config file, arch, mesh, mesh.zero)
CASES = {
    "t2mlr": ("configs/smollm135m_t2mlr.py", "t2mlr", "fsdp:4", 3),
    "lrt": ("configs/lrt_nanochat.py", "lrt", "fsdp:2,expert:2", 3),
    "t2mlr_zero1": ("configs/smollm135m_t2mlr.py", "t2mlr", "data:4", 1),
}


def tiny(config_file: str, arch: str, zero: int = 3):
    c = config_module(config_file).get_config("cpu")
    for path, value in TINY.items():
        section, field = path.split(".")
        setattr(c[section], field, value)
    c.arch, c.mesh.zero = arch, zero
    if arch == "t2mlr":  # D = 5, B = 2: two detached passes (the fori_loop), two with gradients (a scan)
        c.model.recurrence.d_forward = 5
    return resolve(c)


@pytest.fixture(scope="module")
def compiled():
    """{case: (Programs, the compiled train step, its abstract args)} on v5e:2x2, for each of CASES."""
    out = {}
    for case, (config_file, arch, mesh, zero) in CASES.items():
        config = tiny(config_file, arch, zero)
        programs = Programs(config, build_architecture(config, arch), aot.topology_mesh("v5e:2x2", mesh))
        fn, args = programs.train_program(BATCH, SEQ)
        with jax.set_mesh(programs.mesh):
            out[case] = programs, fn.trace(*args).lower().compile(), args
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


@pytest.mark.parametrize("arch", ["t2mlr", "lrt"])  # causal; nanochat's SSSL sliding windows
def test_splash_masks_are_static(compiled, arch):
    """Splash runs from a static mask and segment ids, as MaxText's does: no mask tensor is built (dynamic
    splash's integer partial-mask blocks [rows, heads, q blocks, kv blocks, 128, 128]; the segment ids'
    lane broadcasts [rows, 128, 128] are rank 3) and the kernels are the static-sparsity ones."""
    _, step, _ = compiled[arch]
    text = step.as_text()
    assert not re.findall(r"[su](?:8|16|32)\[\d+(?:,\d+)+,128,128\]", text)
    assert "static_sparsity_splash" in text and "dynamic_sparsity_splash" not in text


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


def collective_bytes(programs: Programs, step, kind: str, in_loop: bool | None = None) -> list[float]:
    """Result bytes of each of the step's `kind` collectives (as parallel.hlo_collectives reads them: a
    TPU reduce-scatter is an all-reduce in an `all-reduce-scatter` fusion); `in_loop`: only those inside
    a loop (a layer scan, a Jacobi pass), or only those outside any."""
    runs, _ = executed(parse(step.as_text()))
    found = [c for c in collectives(runs, programs.mesh.size) if c.kind == kind]
    return [c.result_bytes for c in found if in_loop is None or ("/" in c.host) == in_loop]


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


def test_zero1_keeps_weights_whole_and_scatters_gradients_to_the_optimizer_state(compiled):
    """ZeRO-1 (mesh.zero=1 on data:4) as it should compile: every weight whole on every chip, so no weight
    is gathered inside the loops (layer scans, Jacobi passes); the gradients reduce-scattered to the
    optimizer state's shards (a quarter of it per chip, as the arguments the step takes show) and the new
    weights gathered once, after the update. (A weight the Jacobi passes reuse has its gradient reduced
    inside their loop, each trip: GSPMD keeps no unreduced loop carry, and may all-reduce it there.)"""
    programs, step, (state, batch) = compiled["t2mlr_zero1"]
    whole = lambda tree: sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))
    assert shard_bytes(state.params) == whole(state.params)
    assert whole(state.opt_state) / 4 <= shard_bytes(state.opt_state) < 1.01 * whole(state.opt_state) / 4
    memory = memory_per_device(step)
    assert shard_bytes((state, batch)) <= memory["argument_bytes"] <= shard_bytes((state, batch), tiled=True)
    gathered = lambda in_loop: collective_bytes(programs, step, "all-gather", in_loop)
    assert max(gathered(in_loop=True), default=0) < 64 * 1024  # token ids (the embedding's backward)
    assert max(gathered(in_loop=False)) == max(layer_weights(programs))  # the new embedding, once
    assert collective_bytes(programs, step, "reduce-scatter", in_loop=False)
    assert (
        max(collective_bytes(programs, step, "all-reduce", in_loop=False), default=0) < 64 * 1024
    )  # scalars


def test_expert_weights_stay_on_their_devices(compiled):
    """Each device keeps its experts: nothing it gathers ends in one layer's every expert [X, ...] (what it
    gathers of an MoE weight is its own experts' fsdp shards); the tokens go to the experts instead, each
    device running its experts' grouped matmuls (megablox gmm, tgmm for the weight gradients)."""
    programs, step, _ = compiled["lrt"]
    specs = jax.tree.leaves(programs.arch.specs, is_leaf=lambda x: hasattr(x, "axes"))
    shapes = jax.tree.leaves(programs.state_shapes.params)
    experts = [x.shape[1:] for x, spec in zip(shapes, specs) if "experts" in spec.axes]  # [L, X, ...]
    runs, _ = executed(parse(step.as_text()))
    gathered = [
        dims(r.instruction.type) for r in runs if r.instruction.opcode in ("all-gather", "all-gather-done")
    ]
    assert experts and gathered
    assert not [g for g in gathered for e in experts if tuple(g[-len(e) :]) == e]
    assert {"gmm", "tgmm"} <= set(kernels(step.as_text()))


MIXER_OPS = re.compile(
    r"\.\.\.i,io->\.\.\.o|btd,de->bte"
)  # the mixer's linear maps, its recurrent projection


def test_jacobi_passes_gather_no_weights(compiled):
    """The weights every Jacobi pass rereads (the window's blocks, the mixer's) are gathered once per step
    (t2mlr_jax/parallel/reuse.py), before the detached fori_loop and the gradient scan: no all-gather runs
    in a loop inside another (a pass's layer scan within the Jacobi loops), none of the mixer's in any."""
    _, step, _ = compiled["t2mlr"]
    runs, _ = executed(parse(step.as_text()))
    assert any(run.host.count("/") > 1 for run in runs)  # the layer scans within the Jacobi loops
    in_loops = [c for c in collectives(runs, 4) if c.kind == "all-gather" and c.in_loop]
    assert not [c.op_name for c in in_loops if c.host.count("/") > 1 or MIXER_OPS.search(c.op_name)]


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
