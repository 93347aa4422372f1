"""Training on meshes of 8 fake devices gives one device's losses and parameters, for the baseline and
for T²MLR in Jacobi mode, for a baseline whose width fsdp does not divide (its weights split on another
dimension) and under ZeRO-1 (whole weights, optimizer state split); a checkpoint saved on one mesh
restores onto another."""

import functools
import tempfile
from pathlib import Path

import jax
import numpy as np
import pytest

from t2mlr_jax.experiment import resolve
from t2mlr_jax.model.spec import spec_leaves
from t2mlr_jax.parallel.multihost import global_batch
from t2mlr_jax.train.train_step import compile_step, init_state, model_inputs
from t2mlr_jax.train.trainer import Run
from tests.tiny import tiny_experiment
from tests.train.tiny_task import tiny_batch, tiny_source

# A missing fake-device setup fails loudly instead of skipping the sharding tests.
assert jax.device_count() >= 8, "needs the 8 fake devices of tests/conftest.py"
STEPS = 3
MESHES = [(8, 1, 1), (2, 2, 2), (1, 4, 2)]


def make_run(arch, tmp_path, mesh, zero=3, **sections):
    """`sections`: config sections' fields to set, e.g. baseline={"width_multiple": 4}."""
    config = tiny_experiment(arch, steps=STEPS)
    config.mesh.update(dict(zip(("data", "fsdp", "tensor"), mesh)), zero=zero)
    for section, fields in sections.items():
        config[section].update(fields)
    return Run(resolve(config), tmp_path, tiny_source(), arch)


def batches():
    return [model_inputs(tiny_batch(0, i, 8, 16)) for i in range(1, STEPS + 1)]


def train_on_one_device(run):
    step = compile_step(run.arch, run.optimizer, run.schedule)
    state, losses = init_state(run.arch, run.optimizer, run.config.seed), []
    for batch in batches():
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    return losses, state.params


@functools.cache
def trained_t2mlr_on_2x2x2():
    """T²MLR's state after training on the (2, 2, 2) mesh, shared by the two tests that need it."""
    return train_on_mesh(make_run("t2mlr", Path(tempfile.mkdtemp()), (2, 2, 2)))


def train_on_mesh(run):
    step = run.programs.train_step()
    with jax.set_mesh(run.mesh):
        state = jax.jit(run.programs.init_state, out_shardings=run.state_shardings)()
        losses = []
        for batch in batches():
            state, metrics = step(state, global_batch(batch, run.mesh))
            losses.append(float(metrics["loss"]))
    return losses, state


# One worker for the file: the checkpoint test reuses the T²MLR case's training on (2, 2, 2).
pytestmark = [pytest.mark.xdist_group("sharded_training"), pytest.mark.slow]


def assert_same_training(losses, params, ref_losses, ref_params, atol=1e-6) -> None:
    # Each step's loss: per-token cross-entropies within 2 max |Δ logit| of one device's (log-softmax is
    # 1-Lipschitz in the max norm), which the depth rule bounds by 2 * 4 * depth * u * |logit|: below 1e-5
    # of a loss near ln(vocab) for these 3-layer models at |logit| < 1 (at init). The parameters: AdamW's
    # updates are +-lr wherever |g| >> eps, however g rounds (test_train_step); rtol, atol: the rest.
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(ref_params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=atol)


def assert_trains_as_one_device(run, ref_run, atol=1e-6):
    """`run` (on its mesh) gives `ref_run`'s one-device losses and parameters; its final state returned."""
    losses, state = train_on_mesh(run)
    assert_same_training(losses, state.params, *train_on_one_device(ref_run), atol=atol)
    return state


def large_weights(run) -> dict:
    """The parameter table's matrices and vocabulary tables, by path."""
    specs = spec_leaves(run.arch.specs)
    return {path: s for path, s in specs.items() if s.kind in ("matrix", "embedding", "head")}


def mesh_axes(sharding) -> set[str]:
    return {a for entry in sharding.spec if entry for a in ((entry,) if isinstance(entry, str) else entry)}


def shardings_by_path(tree) -> dict:
    return {tuple(k.key for k in path): s for path, s in jax.tree_util.tree_flatten_with_path(tree)[0]}


@pytest.mark.parametrize("arch", ["transformer", "t2mlr"])
def test_training_on_meshes_equals_one_device(arch, tmp_path):
    ref_losses, ref_params = train_on_one_device(make_run(arch, tmp_path / "ref", (8, 1, 1)))
    for mesh in MESHES:
        on_2x2x2 = arch == "t2mlr" and mesh == (2, 2, 2)
        losses, state = (
            trained_t2mlr_on_2x2x2() if on_2x2x2 else train_on_mesh(make_run(arch, tmp_path, mesh))
        )
        assert_same_training(losses, state.params, ref_losses, ref_params)
    q = state.params["layers"]["self_attn"]["q_proj"]
    assert not q.sharding.is_fully_replicated  # really sharded on the last mesh


def test_checkpoint_saved_on_one_mesh_restores_on_another(tmp_path):
    saver = make_run("t2mlr", tmp_path, (2, 2, 2))
    _, state = trained_t2mlr_on_2x2x2()
    checkpointer = saver.checkpointer()
    checkpointer.save(STEPS, state, {"index": STEPS}, force=True)
    checkpointer.wait()
    checkpointer.close()
    loader = make_run("t2mlr", tmp_path, (1, 4, 2))
    restored, data_state, step, _ = loader.checkpointer().restore_latest(loader.abstract_state())
    assert step == STEPS and data_state == {"index": STEPS}
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    embed = restored.params["embed_tokens"]
    assert embed.sharding.mesh.shape == loader.mesh.shape == {"data": 1, "fsdp": 4, "expert": 1, "tensor": 2}


def test_a_baseline_fsdp_does_not_divide_is_split_on_other_dims_and_trains_as_one_device(tmp_path):
    """The parameter-matched baseline widened to a width fsdp:8 does not divide (as 584 on fsdp:16): every
    large weight is still split over fsdp, on another of its dimensions (rules.FSDP_FALLBACK)."""
    narrow = {"baseline": {"width_multiple": 2}}  # 38 wide
    run = make_run("transformer", tmp_path, (1, 8, 1), **narrow)
    assert run.arch.backbone.hidden_size % 8, run.arch.backbone.hidden_size
    params = shardings_by_path(run.state_shardings.params)
    for path in large_weights(run):
        assert "fsdp" in mesh_axes(params[path]), f"{'/'.join(path)}: {params[path].spec}"
    assert_trains_as_one_device(run, make_run("transformer", tmp_path / "ref", (8, 1, 1), **narrow))


# Muon's Adam groups step at up to 1.3 (embedding_lr 0.3 x (40 / 768) ** -0.5): a rarely seen token's
# tiny gradient rounds to a visibly different step there, a few lr x 1e-6.
@pytest.mark.parametrize(
    "arch, optimizer, variant, atol",
    [
        ("t2mlr", "adamw", "optax", 1e-6),
        ("transformer", "muon", "optax", 1e-5),
        ("transformer", "muon", "nanochat", 1e-5),
    ],
)
def test_zero1_keeps_weights_whole_splits_optimizer_state_and_trains_as_one_device(
    arch, optimizer, variant, atol, tmp_path
):
    """mesh.zero=1 on data:2 x fsdp:4: every weight whole on every device, every large weight's optimizer
    state (Adam's moments, Muon's momentum) split over both data-parallel axes; the same training (both
    Muon steps: optax's, and nanochat's with its NorMuon second moments)."""
    # fp32 Newton-Schulz: in bf16 a sharded reduction's last-bit difference can flip the iterate's rounding
    muon = {"optimizer": {"name": optimizer, "muon": {"ns_dtype": "float32", "variant": variant}}}
    run = make_run(arch, tmp_path, (2, 4, 1), zero=1, **muon)
    assert all(s.is_fully_replicated for s in jax.tree.leaves(run.state_shardings.params))
    moments = shardings_by_path(run.programs.update_shardings)
    for path in large_weights(run):
        assert mesh_axes(moments[path]) == {"data", "fsdp"}, f"{'/'.join(path)}: {moments[path].spec}"
    opt_state = [s for s in jax.tree.leaves(run.state_shardings.opt_state) if not s.is_fully_replicated]
    assert opt_state and all(mesh_axes(s) == {"data", "fsdp"} for s in opt_state)
    state = assert_trains_as_one_device(run, make_run(arch, tmp_path / "ref", (8, 1, 1), **muon), atol)
    assert all(x.sharding.is_fully_replicated for x in jax.tree.leaves(state.params))
