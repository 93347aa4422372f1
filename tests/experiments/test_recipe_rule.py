"""The learning-rate rule, the divergence counter and pre-registration, on inputs worked by hand."""

import json
import math

import pytest

from t2mlr_jax.config.sections import Optimizer
from t2mlr_jax.storage.run_config import write_run_config
from t2mlr_jax.studies import preregistration as prereg
from t2mlr_jax.studies.protocol import Claim
from t2mlr_jax.studies.recipe_rule import choose_multiplier, count_diverged, diverged, stable_multiplier
from t2mlr_jax.train.optimizer import make_schedule


def test_a_loss_above_ln_v_after_step_10_is_a_diverged_run():
    ln_512 = math.log(512)
    assert not diverged([(1, 9.0), (10, 6.5), (11, 6.2), (400, 3.1)], 512)  # warmup's overshoot allowed
    assert diverged([(1, 6.0), (11, ln_512 + 0.01), (400, 3.1)], 512)  # recovered later: still counted
    assert diverged([(20, float("nan"))], 512)
    assert count_diverged({"a/seed0": False, "b/seed2": True, "a/seed1": True}) == {
        "diverged": 2,
        "runs": ["a/seed1", "b/seed2"],
        "of": 3,
    }


def test_the_rule_chooses_the_best_mean_never_a_diverged_multiplier():
    cells = {0.5: {100: 1.0, 101: 1.2}, 1.0: {100: 0.9, 101: 1.1}, 2.0: {100: 0.5, 101: 2.0}}
    assert choose_multiplier(cells) == 1.0  # means 1.1, 1.0, 1.25
    assert choose_multiplier(cells, lower_is_better=False) == 2.0
    assert choose_multiplier(cells, diverged_cells=[1.0]) == 0.5
    assert choose_multiplier({1.0: {0: 1.0}, 2.0: {0: 1.0}}) == 1.0  # a tie: the smaller
    assert choose_multiplier({1.0: {0: float("nan")}, 2.0: {0: 3.0}}) == 2.0
    with pytest.raises(ValueError, match="same sweep seeds"):
        choose_multiplier({1.0: {0: 1.0}, 2.0: {1: 1.0}})
    with pytest.raises(ValueError, match="every multiplier"):
        choose_multiplier({1.0: {0: 1.0}}, diverged_cells=[1.0])


def test_the_swept_multiplier_halves_until_no_probed_row_diverges():
    assert stable_multiplier(0.5, {}) == 0.5  # nothing probed yet: the swept one is the first probe
    assert stable_multiplier(0.5, {0.5: 0}) == 0.5
    assert stable_multiplier(0.5, {0.5: 21}) == 0.25  # the next probe
    assert stable_multiplier(0.5, {0.5: 21, 0.25: 3, 0.125: 0}) == 0.125
    with pytest.raises(ValueError, match="> 0"):
        stable_multiplier(0.0, {})


def test_one_multiplier_scales_every_rate_of_a_recipe():
    """optimizer.lr_multiplier moves AdamW's lr and each of Muon's group rates by the same factor, their
    ratios and the schedule's shape kept."""
    base = Optimizer(lr=3e-3, warmup_ratio=0.1)
    scaled = base.replace(lr_multiplier=0.25)
    for step in (0, 5, 10, 60, 99):
        assert float(make_schedule(scaled, 100)(step)) == pytest.approx(
            0.25 * float(make_schedule(base, 100)(step))
        )
    with pytest.raises(ValueError, match="lr_multiplier"):
        Optimizer(lr_multiplier=-1.0)
    # Muon: a group's rate is its peak x schedule(step) / optimizer.lr, so the multiplier reaches each group
    muon = Optimizer(name="muon", lr=1.0, warmup_ratio=0.0, lr_multiplier=0.5)
    assert float(make_schedule(muon, 10)(0)) / muon.lr == 0.5


def _settings(lr=3e-3, steps=100, gamma=0.1):
    return {
        "optimizer": {"name": "adamw", "lr": lr, "lr_multiplier": 1.0, "grad_clip": 1.0},
        "train": {"steps": steps, "batch_size": 32, "grad_accum": 1, "flop_budget": 0.0, "log_every": 50},
        "model": {"recurrence": {"gamma_recurrent_init": gamma}},
    }


def test_preregistration_is_written_first_kept_and_refuses_another_recipe(tmp_path):
    claims = [Claim("t2mlr", "transformer", "solves", 1), Claim("a", "b", "none", 0, 0.01)]
    recipes = {"t2mlr": prereg.recipe(_settings()), "transformer": prereg.recipe(_settings(gamma=None))}
    record = prereg.preregister(tmp_path, recipes, claims, {"seeds": [0, 1, 2]})
    saved = json.loads((tmp_path / prereg.PREREGISTRATION).read_text())
    assert saved == record and saved["commit"] and saved["claims"][1]["margin"] == 0.01
    assert saved["recipes"]["t2mlr"]["train"] == {
        "steps": 100,
        "batch_size": 32,
        "grad_accum": 1,
        "flop_budget": 0.0,
    }
    # a rerun keeps it; more rows are added beside the recorded ones
    again = prereg.preregister(tmp_path, {"looped": prereg.recipe(_settings())}, claims[:1], {})
    assert (
        again["recipes"].keys() == {"t2mlr", "transformer", "looped"}
        and again["written"] == record["written"]
    )
    before = (tmp_path / prereg.PREREGISTRATION).read_text()
    with pytest.raises(prereg.RecipeMismatch, match="another recipe for t2mlr"):
        prereg.preregister(tmp_path, {"t2mlr": prereg.recipe(_settings(lr=1e-3))}, claims, {})
    with pytest.raises(prereg.RecipeMismatch, match="claim a vs b"):
        prereg.preregister(tmp_path, recipes, [Claim("a", "b", "none", 0, 0.5)], {})
    assert (tmp_path / prereg.PREREGISTRATION).read_text() == before  # nothing changed


def test_a_run_trained_under_another_recipe_is_named(tmp_path):
    registration = {"recipes": {"t2mlr": prereg.recipe(_settings())}}
    same, other = tmp_path / "seed0", tmp_path / "seed1"
    write_run_config(same, {"seed": 0}, _settings())
    write_run_config(other, {"seed": 1}, {**_settings(steps=50), "eval": {"any": 1}})
    assert prereg.unregistered(registration, "t2mlr", [same]) == []
    assert prereg.unregistered(registration, "t2mlr", [same, other]) == [f"{other}: train"]
    assert prereg.unregistered(registration, "looped", [same]) == ["looped: no recipe pre-registered"]
    assert prereg.unregistered(registration, "t2mlr", [tmp_path / "none"])[0].endswith(
        "no run_config.json settings"
    )
