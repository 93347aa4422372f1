"""PonderLM-2's release training as an option (ponderlm2.init="growing", ponderlm2.eval_passes): its growing
initialisation is ours at K = 1, differs at K = 2 and still refines to the exact recurrence; the builder
wires init, the parallel evaluation and their FLOPs, and refuses bad settings before compiling. (That it is
the release's, number for number: tests/interop/test_ponderlm2_release.py.) The refined logits are held to
the float64 rule of tests/tolerance.py against the naive recurrence (tests/reference.py)."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from t2mlr_jax.architectures.lrt import architecture as lrt
from t2mlr_jax.architectures.lrt import thought_slots
from t2mlr_jax.model import flops
from t2mlr_jax.model.token_layout import make_layout
from tests import reference
from tests.architectures.test_lrt import STATE
from tests.architectures.test_thoughts import (
    PARAMS,
    PONDER,
    ROW,
    TOKS4,
    _apply,
    _built,
    _Stub,
    exact_k,
    refine_k,
)
from tests.tiny import NANO
from tests.tolerance import assert_near_f64


@pytest.fixture
def stub(monkeypatch):
    spy = _Stub()
    monkeypatch.setattr(lrt, "refine", spy.refine)
    return spy


GROWING = dataclasses.replace(PONDER, growing=True)


def test_widen_repeats_each_intervals_last_state():
    states = jnp.arange(2 * 3 * 2 * 1, dtype=jnp.float32).reshape(2, 6, 1)  # 3 intervals of 2 slots
    wide = np.asarray(thought_slots.widen(states, 3, 3))[0, :, 0]
    np.testing.assert_array_equal(wide, [0, 1, 1, 1, 2, 3, 3, 3, 4, 5, 5, 5])


@pytest.mark.slow
@pytest.mark.numerics
def test_growing_is_ours_at_one_thought_and_refines_to_the_recurrence_at_two():
    tokens = TOKS4[:, :2]  # 2 tokens x 3 slots: 6 passes are the recurrence
    layout = make_layout(tokens)
    np.testing.assert_array_equal(
        refine_k(GROWING, PARAMS, tokens, layout, 1, 1).logits[-1],
        refine_k(PONDER, PARAMS, tokens, layout, 1, 1).logits[-1],
    )
    grown = refine_k(GROWING, PARAMS, tokens, layout, 1, 2).logits
    assert len(grown) == 1  # the growing pass, like pass 0, is not supervised
    assert np.abs(grown[-1] - refine_k(PONDER, PARAMS, tokens, layout, 1, 2).logits[-1]).max() > 1e-3
    want = exact_k(PONDER, PARAMS, tokens, layout, 2).logits
    truth = reference.lrt(
        PONDER, reference.f64(PARAMS), tokens, layout, thoughts=2, mlp_state=reference.f64(STATE)
    )
    depth = 2 * 3 * NANO.num_layers  # 2 tokens x 3 slots
    assert_near_f64(refine_k(GROWING, PARAMS, tokens, layout, 6, 2).logits[-1], want, truth, depth, "grown")


def test_the_builder_wires_the_release_options(stub):
    release = _built(
        "ponderlm2", thoughts=(2,), init="growing", passes=(3, 4), pass_probs=(0.5, 0.5), eval_passes=4
    )
    _apply(release, draw=lrt.Draw(2, 3))
    assert stub.calls[-1]["cfg"].growing and stub.calls[-1]["thoughts"] == 2
    _apply(release)  # evaluation: the release's parallel forward, 4 passes after the growing ones
    assert stub.calls[-1]["run"] == "parallel" and len(stub.calls[-1]["logits"]) == 4
    ours = _built("ponderlm2", thoughts=(2,), passes=(3,), pass_probs=(1.0,))
    grown = _built("ponderlm2", thoughts=(2,), passes=(3,), pass_probs=(1.0,), init="growing")
    growing_pass = flops.pass_flops(grown.backbone, 2 * (ROW // 3))  # K = 1 over the N = ROW / 3 tokens
    assert grown.train_flops(ROW) - ours.train_flops(ROW) == pytest.approx(flops.train(growing_pass))
    with pytest.raises(
        ValueError, match="ponderlm2.init must be one of .'vocabulary', 'growing'., got 'grow'"
    ):
        _built("ponderlm2", init="grow")
    with pytest.raises(ValueError, match="ponderlm2.eval_passes must be >= 0"):
        _built("ponderlm2", eval_passes=-1)
