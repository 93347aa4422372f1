import jax
import numpy as np
import pytest

from t2mlr_jax.experiment import resolve
from t2mlr_jax.train.train_step import compile_step, init_state, model_inputs
from t2mlr_jax.train.trainer import Run
from tests.tiny import tiny_experiment
from tests.tolerance import assert_within, fp32_bound
from tests.train.tiny_task import tiny_batch, tiny_source


def _run(arch, tmp_path, **model):
    config = tiny_experiment(arch)
    for k, v in model.items():
        config.model[k] = v
    return Run(resolve(config), tmp_path, tiny_source(), arch)


@pytest.mark.slow
def test_grad_accumulation_is_the_same_update_as_one_big_batch(tmp_path):
    run = _run("transformer", tmp_path)
    batch = model_inputs(tiny_batch(0, 1, 8, 16))
    results = []
    for accum in (1, 4):
        step = compile_step(run.arch, run.optimizer, run.schedule, accum)
        state, metrics = step(init_state(run.arch, run.optimizer, 0), batch)
        results.append((state.params, metrics))
    (p1, m1), (p4, m4) = results
    # The same rows in one batch or four: each token's cross-entropy within 2 max |Δ logit| (log-softmax is
    # 1-Lipschitz in the max norm), the depth rule over the task model's 3 layers at |logit| < 10 (an init).
    assert_within(abs(float(m1["loss"]) - float(m4["loss"])), 2 * fp32_bound(3, 10.0), "loss")
    # AdamW's first update is lr * g / (|g| + eps) per parameter: +-lr wherever |g| >> eps, however g rounds
    # (rtol), and at most lr * |Δg| / eps where |g| is of eps's order, a gradient so small that its
    # round-off there moves the update by far less than atol.
    for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p4)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_t2mlr_step_bf16_compute_fp32_master_weights_gate_stats_and_donation(tmp_path):
    run = _run("t2mlr", tmp_path, dtype="bfloat16")
    state = init_state(run.arch, run.optimizer, 0)
    old = jax.tree.leaves(state.params)
    step = compile_step(run.arch, run.optimizer, run.schedule)
    state, metrics = step(state, model_inputs(tiny_batch(0, 1, 8, 16)))
    assert all(x.is_deleted() for x in old)  # the state is donated
    assert {x.dtype for x in jax.tree.leaves(state.params)} == {np.dtype("float32")}
    metrics = jax.device_get(metrics)
    for key in (
        "loss",
        "accuracy",
        "grad_norm",
        "lr",
        "gate/recurrent_gate",
        "gate/input_gate",
    ):
        assert np.isfinite(metrics[key]), key
    assert 0.0 < metrics["gate/recurrent_gate"] < 1.0
    assert int(state.step) == 1
    # parameter statistics are the trainer's, on logging steps, not the step's
    gammas = jax.device_get(run.arch.param_stats(state.params))
    assert set(gammas) == {"tanh_rezero_gamma_recurrent_gate", "tanh_rezero_gamma_input_gate"}
    assert not set(gammas) & set(metrics) and all(np.isfinite(v) for v in gammas.values())


@pytest.mark.slow
def test_a_non_finite_step_keeps_the_state_bitwise(tmp_path):
    """A NaN loss weight makes the loss and gradient norm NaN: the step returns the parameters, optimizer
    state and model state it was given, bit for bit, counting the step."""
    run = _run("transformer", tmp_path)
    state = init_state(run.arch, run.optimizer, 0)
    batch = model_inputs(tiny_batch(0, 1, 8, 16))
    batch["loss_mask"] = np.array(batch["loss_mask"], np.float32)
    batch["loss_mask"][0, 3] = np.nan
    before = jax.device_get((state.params, state.opt_state, state.model_state))
    step = compile_step(run.arch, run.optimizer, run.schedule)
    state, metrics = step(state, batch)
    assert not bool(metrics["finite"]) and not np.isfinite(float(metrics["grad_norm"]))
    after = jax.device_get((state.params, state.opt_state, state.model_state))
    assert jax.tree.structure(after) == jax.tree.structure(before) and int(state.step) == 1
    for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(before)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
