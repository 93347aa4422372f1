"""Resuming under a changed config: another model is refused, and so is a changed optimizer structure (with
the fields named and the workdir untouched) unless train.reset_optimizer asks to resume from the saved
parameters with a fresh optimizer state; settings that may change (learning rate, logging) are accepted,
logged and recorded."""

import json
import logging

import pytest

from t2mlr_jax.storage.checkpoint import StateMismatchError
from t2mlr_jax.storage.run_config import WorkdirMismatchError
from tests.faults.tiny_run import STEPS, assert_same_state, config, final_state, run, train_tiny

pytestmark = [pytest.mark.xdist_group("faults"), pytest.mark.slow]


def _snapshot(workdir):
    return {str(p.relative_to(workdir)): p.read_bytes() for p in sorted(workdir.rglob("*")) if p.is_file()}


def test_a_changed_optimizer_is_refused_untouched_or_reset_on_request(stopped):
    before = _snapshot(stopped)
    wider = config()
    wider.model.hidden_size = 48  # another model: the workdir holds a run of another config
    with pytest.raises(WorkdirMismatchError, match=r"model.hidden_size: 32 \(workdir\) vs 48"):
        run(stopped, wider)
    no_clip = config()
    no_clip.optimizer.grad_clip = 0.0
    with pytest.raises(StateMismatchError, match=r"optimizer.grad_clip: 1.0 -> 0.0.*reset_optimizer=True"):
        run(stopped, no_clip)
    assert _snapshot(stopped) == before

    no_clip.train.reset_optimizer = True
    resumed = run(stopped, no_clip)
    state, restored = resumed.restore_or_init(resumed.checkpointer())
    assert restored.step == 7 and int(state.step) == 7
    saved, _ = run(stopped).restore_or_init(run(stopped).checkpointer())
    assert_same_state(saved.params, state.params)
    fresh = resumed.optimizer.init(state.params)
    assert_same_state(fresh, state.opt_state)
    train_tiny(stopped, no_clip)
    no_clip.train.reset_optimizer = False  # the new structure is saved: a plain resume fits it now
    assert int(final_state(stopped, no_clip).step) == STEPS


def test_settings_that_may_change_are_accepted_and_logged(stopped, straight, caplog):
    faster = config()
    faster.optimizer.lr = 0.002
    assert ("optimizer.lr", 0.003, 0.002) in run(stopped, faster).changes  # accepted: nothing raised
    chatty = config(log_every=1, keep_checkpoints=8)
    with caplog.at_level(logging.WARNING):
        train_tiny(stopped, chatty)
    logged = [r.getMessage() for r in caplog.records if "changed settings" in r.getMessage()]
    assert (
        len(logged) == 1
        and "train.log_every: 3 -> 1" in logged[0]
        and "keep_checkpoints: 6 -> 8" in logged[0]
    )
    settings = json.loads((stopped / "run_config.json").read_text())["settings"]
    assert settings["train"]["log_every"] == 1
    assert_same_state(straight[0], final_state(stopped, chatty))  # logging does not touch the training
