"""experiments/gate_opening.py and the recipe it found for the gated mixer (issue 11, item 5).

The structure: at γ_rec = 0 the gated mixer is exactly x, and W_rec and the recurrent gate projection get
exactly zero gradient (only γ_rec does); `recurrence.gamma_recurrent_init` starts γ_rec elsewhere, and then
they all get one. The CLI: --help, an unknown variant is one error line, and a tiny in-process run of two
variants writes results.json (the fields), results.md and gamma_trajectories.png. The finding, on that tiny
run: from γ_rec = 0 the recurrent gamma stays closed (|tanh γ_rec| < 0.02 at every logged step) while from
γ_rec = 0.1 it stays open with its sign at every logged step, at least 3x the closed run's largest value.
"""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl import flags

from t2mlr_jax.architectures import build_architecture
from t2mlr_jax.architectures.t2mlr import RecurrenceConfig
from t2mlr_jax.architectures.t2mlr.fusion import fuse, mixer_specs
from t2mlr_jax.config.edit import config_module
from t2mlr_jax.experiment import resolve
from t2mlr_jax.model.spec import init_from_specs
from t2mlr_jax.studies import gate_opening
from t2mlr_jax.train.build_data import build_data_source
from t2mlr_jax.train.optimizer import make_optimizer, make_schedule
from t2mlr_jax.train.train_step import init_state, make_train_step, model_inputs
from tests.experiments import ROOT
from tests.tiny import task_model

flags.FLAGS.mark_as_parsed()  # grain reads absl flags


def mixer_grads(gamma_recurrent_init: float) -> tuple[dict, dict, jax.Array, jax.Array]:
    """(params, d sum(w * Phi) / d params, Phi, x) of a fresh gated mixer on random streams."""
    cfg = task_model(recurrence=RecurrenceConfig(gamma_recurrent_init=gamma_recurrent_init))
    params = init_from_specs(mixer_specs(cfg), jax.random.PRNGKey(0), "float32")
    kx, kr, kw = jax.random.split(jax.random.PRNGKey(1), 3)
    x, r, w = (jax.random.normal(k, (2, 5, cfg.hidden_size)) for k in (kx, kr, kw))
    control = jnp.full((2, 5), 2, jnp.int32)

    def objective(p):
        return jnp.sum(w * fuse(cfg, p, x, r, control)[0])

    return params, jax.grad(objective)(params), fuse(cfg, params, x, r, control)[0], x


def norm(tree) -> float:
    return float(sum(jnp.sum(jnp.square(leaf)) for leaf in jax.tree.leaves(tree)) ** 0.5)


def test_at_gamma_zero_only_gamma_rec_gets_a_gradient():
    params, grads, phi, x = mixer_grads(0.0)
    assert float(params["rezero_gamma_recurrent_gate"][0]) == 0.0
    np.testing.assert_array_equal(phi, x)  # the identity at init
    assert norm(grads["recurrent_projection"]) == 0.0
    assert norm(grads["recurrent_gate_proj"]) == 0.0
    assert norm(grads["input_gate_proj"]) == 0.0  # γ_in = 0 too
    assert abs(float(grads["rezero_gamma_recurrent_gate"][0])) > 0
    assert abs(float(grads["rezero_gamma_input_gate"][0])) > 0

    params, grads, phi, x = mixer_grads(0.1)
    assert float(params["rezero_gamma_recurrent_gate"][0]) == pytest.approx(0.1)
    assert float(params["rezero_gamma_input_gate"][0]) == 0.0  # only γ_rec moves
    assert not np.allclose(phi, x)
    assert norm(grads["recurrent_projection"]) > 0
    assert norm(grads["recurrent_gate_proj"]) > 0


def test_a_non_finite_gamma_init_is_refused():
    with pytest.raises(ValueError, match="gamma_recurrent_init must be finite"):
        task_model(recurrence=RecurrenceConfig(gamma_recurrent_init=math.inf))


def test_help_and_an_unknown_variant(capsys):
    with pytest.raises(SystemExit) as exit_info:
        gate_opening.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--preset", "--variants", "--steps", "--seed", "--out"):
        assert flag in out
    with pytest.raises(SystemExit) as exit_info:
        gate_opening.main(["--variants=gated,gated_gamma7"])
    assert exit_info.value.code == 2
    assert "unknown variants ['gated_gamma7']" in capsys.readouterr().err


def test_the_cpu_preset_is_the_opening_recipe():
    """configs/s5_retrieval_t2mlr.py:cpu is the gated mixer with the recipe the experiment found."""
    config = config_module(ROOT / "configs" / "s5_retrieval_t2mlr.py").get_config("cpu")
    recipe = gate_opening.VARIANTS["gated_gamma01"].changes
    assert config.model.recurrence.mixer == recipe["model.recurrence.mixer"] == "gated"
    assert config.model.recurrence.gamma_recurrent_init == recipe["model.recurrence.gamma_recurrent_init"]
    assert config.optimizer.gate_lr_multiplier == recipe["optimizer.gate_lr_multiplier"]


@pytest.mark.slow
def test_tiny_run_writes_the_results_and_a_rerun_trains_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["--preset=tiny", "--variants=gated_gamma01", "--steps=4", f"--out={out}"]
    gate_opening.main(argv)
    result = json.loads((out / "results.json").read_text())
    assert result["meta"]["variants"] == ["gated_gamma01"] and result["meta"]["steps"] == 4
    variant = result["variants"]["gated_gamma01"]
    assert variant["recipe"]["mixer"] == "gated" and variant["recipe"]["gamma_recurrent_init"] == 0.1
    assert variant["recipe"]["gate_lr_multiplier"] == 1.0
    assert variant["summary"]["seeds"] == [42] and variant["summary"]["opened"] in (0, 1)
    (run,) = variant["runs"]
    assert run["seed"] == 42 and run["steps"] == 4  # the config's own seed
    for field in (
        "final_tanh_gamma_rec",
        "final_tanh_gamma_in",
        "max_abs_tanh_gamma_rec",
        "final_train_loss",
    ):
        assert math.isfinite(run[field]), field
    assert run["first_step_open"] is None or run["first_step_open"] <= 4
    for field in ("exact_match", "token_accuracy", "loss"):
        assert math.isfinite(run["eval"][field]), field
    assert run["series"]["tanh_gamma_rec"]["step"] == [2, 4]
    assert (out / "gated_gamma01" / "seed42" / "summary.json").exists()
    assert (out / "gamma_trajectories.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert "| `gated_gamma01` | 42 |" in (out / "results.md").read_text()
    assert "| `gated_gamma01` |" in capsys.readouterr().out

    again = gate_opening.main(argv)  # reads the finished run back, trains nothing
    assert ": training t2mlr" not in capsys.readouterr().out
    assert again["variants"]["gated_gamma01"]["runs"][0]["series"] == run["series"]


@pytest.mark.slow
def test_from_zero_gamma_rec_stays_closed_and_from_0_1_it_stays_open():
    """The finding, on the tiny model with the trainer's own step: the same batches, one compiled step,
    two starting points that differ only in γ_rec."""
    config = gate_opening.variant_config("gated", 0, "tiny", None)
    steps = 24
    arch = build_architecture(resolve(config))
    optimizer = make_optimizer(resolve(config).optimizer, arch.specs, steps)
    step = jax.jit(make_train_step(arch, optimizer, make_schedule(resolve(config).optimizer, steps)))
    batches = build_data_source(resolve(config)).train_iterator()
    batches = [model_inputs(next(batches)) for _ in range(steps)]
    closed = init_state(arch, optimizer, config.seed)
    mixer = {**closed.params["mixer"], "rezero_gamma_recurrent_gate": jnp.full((1,), 0.1, jnp.float32)}
    opened = closed._replace(params={**closed.params, "mixer": mixer})

    def trajectory(state) -> list[float]:
        values = []
        for batch in batches:
            state, _ = step(state, batch)
            values.append(
                float(arch.param_stats(state.params)[gate_opening.GAMMA_REC])
            )  # as the trainer logs
        return values

    from_zero, from_point_one = trajectory(closed), trajectory(opened)
    assert max(map(abs, from_zero)) < 0.02, from_zero  # γ_rec hovers at 0
    assert min(from_point_one) > 3 * max(map(abs, from_zero)), (from_point_one, from_zero)
