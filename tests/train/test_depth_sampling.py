"""The release's optional per-step sampling of the Jacobi depth D: parsing, determinism, and a training run
whose every step is the fixed-D step of the depth it logs."""

import json

import jax
import numpy as np
import pytest

from t2mlr_jax.architectures.depth_sampling import depth_values, draw_at
from t2mlr_jax.architectures.t2mlr import Depth
from t2mlr_jax.experiment import resolve
from t2mlr_jax.parallel.multihost import global_batch
from t2mlr_jax.train.train_step import model_inputs
from t2mlr_jax.train.trainer import Run, train
from tests.tiny import tiny_experiment
from tests.train.tiny_task import tiny_source


def _config(spec, minimum=1, **fields):
    """A tiny T²MLR config; fields of the t2mlr section go there, the rest to train."""
    config = tiny_experiment("t2mlr", **{k: v for k, v in fields.items() if k not in ("forward_mode",)})
    config.t2mlr.update(d_forward_values=spec, d_forward_min=minimum)
    config.t2mlr.update({k: v for k, v in fields.items() if k == "forward_mode"})
    return config


@pytest.mark.parametrize(
    "spec, minimum, values",
    [
        ("", 1, None),
        ("4", 2, [2, 3, 4]),
        ("8,16,32", 1, [8, 16, 32]),
        ("16 8 8", 1, [8, 16]),
    ],
)
def test_depth_specs(spec, minimum, values):
    assert depth_values(resolve(_config(spec, minimum))) == values


@pytest.mark.parametrize(
    "spec, minimum, fields, message",
    [
        ("eight", 1, {}, "a max depth 'N' or a list"),
        ("0", 1, {}, "gives no depth >= 1"),
        ("3", 5, {}, "gives no depth >= 1"),
        ("4", 0, {}, "d_forward_min must be >= 1"),
        ("4", 1, {"forward_mode": "exact"}, "needs t2mlr.forward_mode='jacobi'"),
    ],
)
def test_bad_depth_specs_are_one_clear_error(spec, minimum, fields, message):
    with pytest.raises(ValueError, match=message):
        depth_values(resolve(_config(spec, minimum, **fields)))


def test_depths_depend_on_seed_and_step_only():
    draws = [draw_at([1, 2, 4], 0, step) for step in range(1, 41)]
    assert draws == [draw_at([1, 2, 4], 0, step) for step in range(1, 41)]
    assert set(draws) == {1, 2, 4}
    assert draws != [draw_at([1, 2, 4], 1, step) for step in range(1, 41)]


@pytest.mark.slow
def test_each_step_is_the_fixed_depth_step_it_logs(tmp_path):
    config = _config("1,4", steps=2, log_every=1, checkpoint_every=100, eval_every=0)
    run = Run(resolve(config), tmp_path, tiny_source(), "t2mlr")
    train(run)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    logged = [(r["step"], int(r["d_forward"]), r["loss"]) for r in rows if "d_forward" in r]
    assert [(s, d) for s, d, _ in logged] == [(s, draw_at([1, 4], config.seed, s)) for s in range(1, 3)]
    assert {d for _, d, _ in logged} == {1, 4}  # this seed draws both in its first 2 steps

    # Replay with fixed-D steps, compiled as the trainer compiles them: the same losses, so the sampled D is
    # the one that ran.
    state = jax.jit(run.programs.init_state, out_shardings=run.state_shardings)()
    iterator, steps = run.data.train_iterator(), {}
    with jax.set_mesh(run.mesh):
        for _step, depth, loss in logged:
            steps.setdefault(depth, run.programs.train_step(Depth(depth)))
            state, metrics = steps[depth](state, global_batch(model_inputs(next(iterator)), run.mesh))
            # the sampled step's program compiled again: its loss to round-off at most (a cross-entropy within
            # 2 max |Δ logit|, tests/tolerance.py's depth rule, far below 1e-5 of a loss near ln(vocab))
            np.testing.assert_allclose(float(jax.device_get(metrics["loss"])), loss, rtol=1e-5)
