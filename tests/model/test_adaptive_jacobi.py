"""Convergence-adaptive Jacobi (recurrence.jacobi_tolerance): None / 0 is the fixed-depth program; with a
tolerance the forward equals the fixed-depth one at the pass count it reports (values and gradients); once
R has converged it equals the exact recurrence in fewer than D passes; the count is a training metric;
sharded over the batch it agrees with one device. Bounds: the depth rule of tests/tolerance.py, the depth
counted by test_recurrence's `chain` (D passes of the window, a gradient twice its forward)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding

from t2mlr_jax.architectures.t2mlr import recurrent
from t2mlr_jax.architectures.t2mlr.recurrence import jacobi_forward, relative_change
from t2mlr_jax.experiment import resolve
from t2mlr_jax.model.params import param_axes
from t2mlr_jax.model.token_layout import make_layout
from t2mlr_jax.parallel.mesh import make_mesh
from t2mlr_jax.parallel.placement import param_shardings
from t2mlr_jax.parallel.rules import partition_spec
from t2mlr_jax.studies.parity import recurrence_layers
from t2mlr_jax.train.train_step import compile_step, init_state, model_inputs
from t2mlr_jax.train.trainer import Run
from tests.model.test_recurrence import ce_loss
from tests.tiny import exact, jacobi, tiny_config, tiny_experiment, tiny_params, tokens
from tests.tolerance import assert_fp32_close
from tests.train import tiny_task

T = 12
CFG = tiny_config()


def adaptive(tolerance, **recurrence):
    return recurrent(tiny_config(), jacobi_tolerance=tolerance, **recurrence)


def loss_and_grad(cfg, params, toks, d, b, layout=None):
    """(logits, passes), gradient of the next-token loss: the train step's use of the forward."""

    def loss(p):
        out = jacobi_forward(cfg, p, toks, layout=layout, d_forward=d, d_backward=b)
        return ce_loss(out.logits, toks), (out.logits, out.jacobi_passes)

    (_, aux), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    return aux, grads


def assert_same_grads(a, b, depth):
    """Leaf by leaf, each at its own scale; `depth` is the forward's (a gradient runs there and back)."""
    for path, x in jax.tree_util.tree_leaves_with_path(a):
        y = b
        for key in path:
            y = y[key.key]
        assert_fp32_close(x, y, 2 * depth, jax.tree_util.keystr(path))


def test_relative_change_reads_only_positions_where_r_is_read():
    old = jnp.ones((2, 3, 4))
    new = old.at[0, 1].add(0.5).at[1, 2].add(100.0)  # row 1 moves only where R is not read
    read = jnp.array([[True, True, True], [True, True, False]])
    # an analytic value: a few fp32 roundings (u = 6e-8) of a mean, a square root and a divide
    assert float(relative_change(new, old, read)) == pytest.approx(1.0 / math.sqrt(12), rel=1e-6)
    zeros = jnp.zeros((2, 3, 4))
    assert float(relative_change(zeros, zeros, read)) == 0.0  # no 0 / 0


def test_no_tolerance_or_zero_is_the_fixed_depth_program():
    params, toks = tiny_params(CFG, gamma=0.8), tokens(2, T)
    lower = lambda cfg: jax.jit(lambda p: jacobi_forward(cfg, p, toks, d_forward=6, d_backward=2)).lower(
        params
    )
    program = lower(CFG).as_text()
    assert lower(adaptive(0.0)).as_text() == program  # bit for bit: the same computation
    assert lower(adaptive(1e-3)).as_text() != program
    assert int(jacobi(CFG, params, toks, d_forward=6, d_backward=2).jacobi_passes) == 6
    assert exact(CFG, params, toks).jacobi_passes is None


@pytest.mark.slow
@pytest.mark.numerics
def test_unreachable_tolerance_runs_all_d_passes():
    params, toks = tiny_params(CFG, gamma=0.8), tokens(2, T)
    (logits, passes), grads = loss_and_grad(adaptive(1e-30), params, toks, 6, 2)
    (ref, _), ref_grads = loss_and_grad(CFG, params, toks, 6, 2)
    assert int(passes) == 6  # D < T: R moves at every pass
    assert_fp32_close(logits, ref, recurrence_layers(CFG, 6), "logits")
    assert_same_grads(grads, ref_grads, recurrence_layers(CFG, 6))


@pytest.mark.slow
@pytest.mark.numerics
@pytest.mark.parametrize("b", [0, 2])
def test_large_tolerance_stops_after_the_first_detached_pass(b):
    """The unfused pass, one detached refinement (it measures the change), the B gradient passes: the
    fixed-depth forward with D = 2 + B, in values and gradients."""
    params, toks = tiny_params(CFG, gamma=0.8), tokens(2, T)
    (logits, passes), grads = loss_and_grad(adaptive(1e9), params, toks, 8, b)
    assert int(passes) == 2 + b
    (ref, _), ref_grads = loss_and_grad(CFG, params, toks, 2 + b, b)
    assert_fp32_close(logits, ref, recurrence_layers(CFG, 2 + b), "logits")
    assert_same_grads(grads, ref_grads, recurrence_layers(CFG, 2 + b))


@pytest.mark.numerics
def test_converged_passes_equal_exact_in_fewer_than_d():
    """A contracting recurrence (small gammas, no temporal residual) on rows with padding and prompts:
    with D > T it stops by convergence, well before D and T, at the exact recurrence's logits."""
    cfg = adaptive(1e-6, temporal_residual=False)
    params, toks = tiny_params(cfg, gamma=0.2), tokens(3, T)
    cf = jnp.array([[2] * T, [1] * 3 + [2] * (T - 3), [0] * 2 + [1] * 2 + [2] * (T - 4)])
    seg = (cf > 0).astype(jnp.int32)
    layout = make_layout(toks, jnp.maximum(jnp.cumsum(seg, axis=1) - 1, 0), seg, cf)
    out = jacobi(cfg, params, toks, layout=layout, d_forward=16, d_backward=2)
    want = exact(cfg, params, toks, layout=layout).logits
    real = np.asarray(seg, bool)
    assert_fp32_close(
        np.asarray(out.logits)[real], np.asarray(want)[real], recurrence_layers(cfg, T), "logits"
    )
    assert int(out.jacobi_passes) < T and float(out.jacobi_change) < 1e-6
    capped = jacobi(cfg, params, toks, layout=layout, d_forward=4, d_backward=1)  # 2 detached passes
    assert int(capped.jacobi_passes) == 4 and float(capped.jacobi_change) >= 1e-6  # stopped unconverged


@pytest.mark.slow
def test_training_step_logs_the_passes(tmp_path):
    config = tiny_experiment("t2mlr")
    config.model.recurrence.update(d_forward=6, d_backward=2, jacobi_tolerance=1e9)
    run = Run(resolve(config), tmp_path, tiny_task.tiny_source(), "t2mlr")
    # Two micro-batches: the logged count is their mean, not their sum.
    step = compile_step(run.arch, run.optimizer, run.schedule, grad_accum=2)
    _, metrics = step(init_state(run.arch, run.optimizer, 0), model_inputs(tiny_task.tiny_batch(0, 1, 8, 16)))
    assert float(metrics["jacobi_passes"]) == 4.0  # 1 + one detached + B = 2
    assert float(metrics["jacobi_converged"]) == 1.0 and 0 < float(metrics["jacobi_change"]) < 1e9
    config.model.recurrence.jacobi_tolerance = None
    arch = Run(resolve(config), tmp_path / "fixed", tiny_task.tiny_source(), "t2mlr").arch
    stats = lambda p, b: arch.apply(p, b, training=True, rng=None, model_state={}).token_stats
    params = jax.eval_shape(arch.init, jax.random.PRNGKey(0))
    batch = model_inputs(tiny_task.tiny_batch(0, 1, 8, 16))
    assert not {"jacobi_passes", "jacobi_converged"} & set(jax.eval_shape(stats, params, batch))


@pytest.mark.slow
@pytest.mark.numerics
def test_sharded_over_the_batch_equals_one_device():
    """The stopping test is a max over the global batch (a reduction across devices, no host sync)."""
    cfg = adaptive(1e-2, temporal_residual=False)
    params, toks = tiny_params(cfg, gamma=0.2), tokens(8, 8)

    def loss(p, t):
        out = jacobi_forward(cfg, p, t, d_forward=8, d_backward=2)
        return out.logits.std(), out.jacobi_passes

    fn = jax.jit(jax.value_and_grad(loss, has_aux=True))
    (ref_loss, ref_passes), ref_grad = fn(params, toks)
    mesh = make_mesh(2, 2, 2)
    with jax.set_mesh(mesh):
        sharded = jax.device_put(params, param_shardings(param_axes(cfg), params, mesh))
        spec = partition_spec(("batch", "length"), toks.shape, mesh)
        (loss, passes), grad = fn(sharded, jax.device_put(toks, NamedSharding(mesh, spec)))
    assert int(passes) == int(ref_passes) < 8
    depth = recurrence_layers(cfg, 8)  # at most D = T = 8 passes
    assert_fp32_close(loss, ref_loss, depth, "loss")
    assert_same_grads(grad, ref_grad, depth)


@pytest.mark.parametrize("bad", [-1e-3, math.nan, math.inf])
def test_bad_tolerance_is_one_line_error(bad):
    with pytest.raises(ValueError, match="recurrence.jacobi_tolerance must be None or a finite") as e:
        adaptive(bad)
    assert "\n" not in str(e.value)
