"""Resuming under a changed config: a changed optimizer structure is refused with the fields named and the
workdir untouched, or, with train.reset_optimizer, resumed from the saved parameters with a fresh optimizer
state; settings that may change (the learning rate) are accepted and logged."""

import json
import logging

import jax
import numpy as np
import pytest

from t2mlr_jax.train.checkpoint import StateMismatchError
from tests.faults.tiny_run import STEPS, assert_same_state, config, final_state, run, train_tiny

pytestmark = pytest.mark.xdist_group("faults")


def _snapshot(workdir):
    return {str(p.relative_to(workdir)): p.read_bytes() for p in sorted(workdir.rglob("*")) if p.is_file()}


def test_a_changed_optimizer_is_refused_untouched_or_reset_on_request(stopped):
    before = _snapshot(stopped)
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


def test_a_changed_learning_rate_is_accepted_and_logged(stopped, caplog):
    faster = config()
    faster.optimizer.lr = 0.002
    with caplog.at_level(logging.WARNING):
        train_tiny(stopped, faster)
    assert any("optimizer.lr: 0.003 -> 0.002" in r.getMessage() for r in caplog.records)
    settings = json.loads((stopped / "run_config.json").read_text())["settings"]
    assert settings["optimizer"]["lr"] == 0.002
    state = final_state(stopped, faster)
    assert np.isfinite(np.asarray(jax.tree.leaves(state.params)[0])).all()
