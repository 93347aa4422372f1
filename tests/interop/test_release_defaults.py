"""The authors' T²MLR release's default settings: its B >= D (default D = 1, B = 10,000,000) is the gradient
through every pass, ours B = D. The mapping on its own, then a model the release saved with its defaults
(tests/interop/fixtures/release_default/, made by the release's own code: experiments/make_release_fixture.py)
imports, computes the release's logits and Jacobi gradients, and exports back to settings the release reads
the same. The gradients are what tell B's meanings apart: logits do not depend on B."""

from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from t2mlr_jax.architectures.t2mlr import model_config_from_release, recurrent, release_config, t2mlr_layout
from t2mlr_jax.architectures.t2mlr.recurrence import exact_forward, jacobi_forward
from t2mlr_jax.formats.files import read_json, read_state_dict
from t2mlr_jax.formats.tables import to_state_dict
from t2mlr_jax.interop import save_t2mlr_torch
from t2mlr_jax.interop.pretrained import mismatches, pretrained_config
from t2mlr_jax.model import backbone
from t2mlr_jax.studies.parity import max_abs_diff, path_layers
from tests.interop.helpers import (
    assert_grads_parity,
    assert_planted_fails,
    state_dicts_identical,
)
from tests.tolerance import assert_fp32_close

FIXTURE = Path(__file__).parent / "fixtures/release_default"
RELEASE = dict(np.load(FIXTURE / "release.npz"))
SAVED = read_json(FIXTURE / "model/config.json")
TOKENS = jnp.asarray(RELEASE["tokens"])
DEPTHS = ("batch_forward_approximate_depth", "batch_backward_approximate_depth")  # the release's D, B
# Each output's path (parity.path_layers): 4 layers, the window [1, 2] (W = 2), 12 tokens: the exact
# recurrence L + (T - 1) W, the Jacobi iteration at D passes L + D W.
EXACT_LAYERS = 4 + 11 * 2


def jacobi_layers(depth: int) -> int:
    return 4 + depth * 2


# d_backward None: omitted, the release's default (10,000,000)
@pytest.mark.parametrize(
    "d_forward, d_backward, ours", [(1, None, 1), (16, None, 16), (4, 9, 4), (4, 4, 4), (16, 4, 4), (4, 0, 0)]
)
def test_the_release_b_reads_as_ours_and_writes_back(d_forward, d_backward, ours):
    settings = {k: v for k, v in SAVED.items() if k not in DEPTHS}
    given = {DEPTHS[0]: d_forward} | ({} if d_backward is None else {DEPTHS[1]: d_backward})
    cfg = model_config_from_release(settings | given)
    assert (cfg.recurrence.d_forward, cfg.recurrence.d_backward) == (d_forward, ours)
    written = release_config(cfg)
    assert (written[DEPTHS[0]], written[DEPTHS[1]]) == (d_forward, ours)  # the release reads B = D as B >= D
    assert model_config_from_release(written) == cfg


def test_connection_detach_is_no_gradient_through_r():
    settings = {k: v for k, v in SAVED.items() if k not in DEPTHS} | {DEPTHS[0]: 4, "connection_detach": True}
    cfg = model_config_from_release(settings)
    assert cfg.recurrence.d_backward == 0
    assert release_config(cfg)[DEPTHS[1]] == 0  # the release reads B = 0 < D as every pass detached


def test_init_from_takes_the_users_depths_and_checks_them():
    checkpoint = pretrained_config(FIXTURE / "model")  # what init_from reads: the release's B mapped
    assert checkpoint.recurrence.d_backward == checkpoint.recurrence.d_forward == 1
    assert mismatches(checkpoint, recurrent(checkpoint, d_forward=16, d_backward=4)) == []
    with pytest.raises(ValueError, match="must be <= d_forward"):  # a user's B > D stays refused
        recurrent(checkpoint, d_forward=2, d_backward=5)


def at_depth(depth: int):
    """Our config for the release run at Jacobi depth `depth` with the saved (default) B."""
    return model_config_from_release({**SAVED, DEPTHS[0]: depth})


@partial(jax.jit, static_argnums=0)
def jacobi_loss_and_grads(cfg, params):
    """The release fixture's loss: mean next-token cross-entropy of the Jacobi forward, all recurrent."""

    def loss(params):
        logits = jacobi_forward(cfg, params, TOKENS).logits
        return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], TOKENS[:, 1:]).mean()

    return jax.value_and_grad(loss)(params)


def test_the_release_defaults_import_as_b_equals_d(imported):
    cfg, _ = imported
    assert (SAVED[DEPTHS[0]], SAVED[DEPTHS[1]]) == (1, 10_000_000)  # the release's defaults, untouched
    assert (cfg.recurrence.d_forward, cfg.recurrence.d_backward) == (1, 1)
    assert (at_depth(3).recurrence.d_forward, at_depth(3).recurrence.d_backward) == (3, 3)


@pytest.mark.slow
@pytest.mark.numerics
def test_logits_match_the_release(imported):
    cfg, params = imported
    assert path_layers(cfg, params, TOKENS.shape[1]) == {
        "logits": EXACT_LAYERS,
        "decode": EXACT_LAYERS,
        "train": jacobi_layers(1),
    }
    exact = exact_forward(cfg, params, TOKENS).logits
    assert_fp32_close(exact, RELEASE["exact"], EXACT_LAYERS, "exact recurrence")
    assert_fp32_close(
        jacobi_forward(cfg, params, TOKENS).logits, RELEASE["jacobi_d1"], jacobi_layers(1), "D 1"
    )
    jacobi_d3 = jacobi_forward(at_depth(3), params, TOKENS).logits
    assert_fp32_close(jacobi_d3, RELEASE["jacobi_d3"], jacobi_layers(3), "D 3")
    assert_planted_fails(backbone.forward(cfg, params, TOKENS), exact, EXACT_LAYERS, 0.1, "recurrence off")


@pytest.mark.slow
@pytest.mark.numerics
@pytest.mark.parametrize("depth", [1, 3])
def test_jacobi_gradients_match_the_release(imported, depth):
    _, params = imported
    cfg = at_depth(depth)
    grads = to_state_dict(t2mlr_layout(cfg), jacobi_loss_and_grads(cfg, params)[1])
    theirs = {
        key.split(":", 1)[1]: value for key, value in RELEASE.items() if key.startswith(f"grad_d{depth}:")
    }
    assert_grads_parity(grads, theirs, jacobi_layers(depth), f"D {depth} gradient")
    # B < D (R<1> detached) would compute other gradients: the fixture tells the two meanings apart.
    detached = jacobi_loss_and_grads(recurrent(cfg, d_backward=depth - 1), params)[1]
    grads = to_state_dict(t2mlr_layout(cfg), detached)
    worst = max(theirs, key=lambda key: max_abs_diff(grads[key], theirs[key]))
    # relative_bound(2L + 1) is the gradients' bound, gradient_bound(L)
    layers = 2 * jacobi_layers(depth) + 1
    assert_planted_fails(grads[worst], theirs[worst], layers, 1e-3, f"D {depth}, B {depth - 1}: {worst}")


def test_export_writes_back_what_the_release_reads(imported, tmp_path):
    cfg, params = imported
    save_t2mlr_torch(cfg, params, tmp_path / "back")
    written = read_json(tmp_path / "back/config.json")
    # B = D: to the release, as its B >= D, the gradient through every pass.
    assert written[DEPTHS[0]] == written[DEPTHS[1]] == 1
    assert model_config_from_release(written) == cfg
    assert state_dicts_identical(read_state_dict(FIXTURE / "model"), read_state_dict(tmp_path / "back"))
