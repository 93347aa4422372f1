"""model.scan_layers=False: the train state holds the blocks' weights per layer. It draws the same
weights, takes the same steps, checkpoints them, and interop reads the checkpoint stacked."""

import jax
import numpy as np
import pytest

from t2mlr_jax.architectures import build_architecture
from t2mlr_jax.experiment import resolve
from t2mlr_jax.model import layer_layout
from t2mlr_jax.model.spec import is_spec
from t2mlr_jax.storage import checkpoint as ckpt
from t2mlr_jax.storage import run_config
from t2mlr_jax.train.optimizer import muon_depth
from t2mlr_jax.train.train_step import compile_step, init_state, model_inputs
from t2mlr_jax.train.trainer import Run
from tests.tiny import tiny_experiment
from tests.train.tiny_task import tiny_batch, tiny_source


def _run(arch, workdir, scan_layers):
    config = tiny_experiment(arch)
    config.model.scan_layers = scan_layers
    config.model.remat = "dots"  # the unrolled blocks are rematerialised as the scan's body is
    return Run(resolve(config), workdir, tiny_source(), arch)


def _two_steps(run):
    state = init_state(run.arch, run.optimizer, 0)
    step = compile_step(run.arch, run.optimizer, run.schedule)
    for i in range(2):
        state, metrics = step(state, model_inputs(tiny_batch(0, i, 8, 16)))
    return state, float(metrics["loss"])


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["t2mlr", "lrt", "looped"])
def test_per_layer_weights_train_exactly_as_the_stack(arch, tmp_path):
    stacked, apart = (_run(arch, tmp_path / str(s), s) for s in (True, False))
    assert layer_layout.is_per_layer(apart.arch.specs) and not layer_layout.is_per_layer(stacked.arch.specs)
    (s_state, s_loss), (a_state, a_loss) = _two_steps(stacked), _two_steps(apart)
    assert len(a_state.params["layers"]) == 3
    # The same computation with the layers' weights stacked or apart: the losses measured bitwise equal
    # (native, AVX2, SSE4.2); 1e-6 = 17 u leaves the scan's and the unrolled loop's fusions a few roundings.
    assert a_loss == pytest.approx(s_loss, rel=1e-6)
    key = jax.random.PRNGKey(0)
    pairs = [
        (layer_layout.stacked(apart.arch.init(key)), stacked.arch.init(key), 0.0),  # the same draws
        # the same steps: two AdamW updates of +-lr whatever the gradients' round-off (test_train_step); the
        # parameters measured within 6e-8, a rounding of |w| ~ 1
        (layer_layout.stacked(a_state.params), s_state.params, 1e-6),
    ]
    for apart_tree, stacked_tree, atol in pairs:
        assert jax.tree.structure(apart_tree) == jax.tree.structure(stacked_tree)
        for got, want in zip(jax.tree.leaves(apart_tree), jax.tree.leaves(stacked_tree)):
            np.testing.assert_allclose(got, want, atol=atol)


@pytest.mark.slow
def test_a_per_layer_checkpoint_reads_stacked_and_the_other_form_is_refused(tmp_path):
    run = _run("t2mlr", tmp_path, False)
    state = run.fresh_state()
    assert layer_layout.stacked(jax.device_get(state.params)).keys() == state.params.keys()
    saver = run.checkpointer()
    saver.save(1, state, {"index": 1}, force=True)
    saver.wait()
    saver.close()
    read = ckpt.read_step_params(tmp_path / "checkpoints" / "1")
    want = layer_layout.stacked(jax.device_get(state.params))
    assert jax.tree.structure(read) == jax.tree.structure(want)
    for got, expected in zip(jax.tree.leaves(read), jax.tree.leaves(want)):
        np.testing.assert_array_equal(got, expected)
    run_config.write_run_config(tmp_path, run.identity)
    with pytest.raises(run_config.WorkdirMismatchError, match="model.scan_layers: False .workdir. vs True"):
        _run("t2mlr", tmp_path, True)


def test_the_table_follows_the_form_and_an_lstm_has_no_blocks_to_hold_apart():
    config = tiny_experiment("t2mlr")
    stacked = build_architecture(resolve(config)).specs
    config.model.scan_layers = False
    apart = build_architecture(resolve(config)).specs
    facts = lambda specs: jax.tree.map(lambda s: (s.shape, s.axes, s.kind, s.in_dims), specs, is_leaf=is_spec)
    assert facts(layer_layout.stacked(apart)) == facts(stacked)
    assert muon_depth(apart) == muon_depth(stacked) == 3
    assert apart["layers"][0]["mlp"]["up_proj"].axes == stacked["layers"]["mlp"]["up_proj"].axes[1:]
    lstm = tiny_experiment("lstm")
    lstm.model.scan_layers = False
    with pytest.raises(ValueError, match="model.scan_layers=False: architecture 'lstm' has no transformer"):
        build_architecture(resolve(lstm), "lstm")
