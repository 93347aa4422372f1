"""The LRT release's parallel interleaved training (lrt.training="interleaved"): its passes reduce to the
known cases (N = 1 is one refinement pass, N = T the exact recurrence, packed documents included), its
loss is the mean of the passes' mean cross-entropies, and the architecture trains with it. Parity with
the release's own training step: tests/interop/test_nanochat_release.py. Bounds: the depth rule of
tests/tolerance.py (passes x layers), the exact recurrence's by the float64 rule (test_lrt's reference)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from t2mlr_jax.architectures import build_architecture
from t2mlr_jax.architectures.lrt import forward as lrt_forward
from t2mlr_jax.experiment import resolve
from t2mlr_jax.train.train_step import make_grad_fn
from tests.architectures.test_lrt import (
    CFG,
    LAYOUT,
    PARAMS,
    STATE,
    TOKS,
    _config,
    _truth,
    exact,
    refine,
)
from tests.tiny import NANO
from tests.tolerance import assert_fp32_close, assert_near_f64
from tests.train.tiny_task import tiny_batch

T = TOKS.shape[1]
interleaved = jax.jit(lrt_forward.interleaved, static_argnums=(0, 4, 6))


@pytest.mark.numerics
@pytest.mark.parametrize("kv_refresh", [False, True], ids=["plain", "kv_refresh"])
def test_one_interleaved_pass_is_one_refinement_pass(kv_refresh):
    """N = 1 reruns every position (any refresh before it is overwritten)."""
    want = refine(CFG, PARAMS, TOKS, LAYOUT, 1, STATE).logits
    got = interleaved(CFG, PARAMS, TOKS, LAYOUT, 1, STATE, kv_refresh).logits
    for i, (ours, theirs) in enumerate(zip(got, want, strict=True)):
        assert_fp32_close(ours, theirs, (i + 1) * NANO.num_layers, f"pass {i}")  # pass i: i + 1 passes deep


@pytest.mark.slow
@pytest.mark.numerics
def test_t_interleaved_passes_are_the_exact_recurrence():
    """Pass i reruns position i alone, after every earlier position has its exact state and keys: the
    sequential recurrence (row 1 holds two documents: the memory resets at the second's start), with the
    KV refresh too (it touches only positions not yet rerun, which pass i cannot see but its own)."""
    want, truth, depth = exact(CFG, PARAMS, TOKS, LAYOUT, STATE).logits, _truth(LAYOUT), T * NANO.num_layers
    first, merged = interleaved(CFG, PARAMS, TOKS, LAYOUT, T, STATE, False).logits
    assert_near_f64(merged, want, truth, depth, "T passes")
    first_pass = refine(CFG, PARAMS, TOKS, LAYOUT, 0, STATE).logits[0]
    assert_fp32_close(first, first_pass, NANO.num_layers, "pass 0")
    refreshed = interleaved(CFG, PARAMS, TOKS, LAYOUT, T, STATE, True).logits[1]
    assert_near_f64(refreshed, want, truth, depth, "T passes, KV refresh")
    # between the two, N = 2 is neither: its pass 1 reads stale keys at the even positions (pass 0's, or
    # refreshed from the newer memory)
    _, two = interleaved(CFG, PARAMS, TOKS, LAYOUT, 2, STATE, False).logits
    _, refreshed = interleaved(CFG, PARAMS, TOKS, LAYOUT, 2, STATE, True).logits
    assert min(np.abs(two - want).max(), np.abs(refreshed - want).max(), np.abs(two - refreshed).max()) > 1e-3


@pytest.mark.slow
def test_the_architecture_trains_with_the_releases_loss():
    """arch=lrt with lrt.training=interleaved (and the KV refresh): N fixed (no draw), the loss the mean
    over the 1 + N passes of each one's mean cross-entropy over its supervised positions (N = 3 over 16:
    passes of 6, 5 and 5 positions, padded rows included), a gradient for every parameter, and one
    refinement's FLOPs."""
    n = 3
    settings = dict(training="interleaved", interleaved_num_passes=n, interleaved_kv_refresh=True)
    arch = build_architecture(resolve(_config(**settings)), "lrt")
    assert arch.sample is None
    params = arch.init(jax.random.PRNGKey(0))
    batch = jax.tree.map(jnp.asarray, tiny_batch(0, 1, 4, 16))
    state = arch.init_model_state()
    grads, (sums, _) = jax.jit(make_grad_fn(arch, mean=True))(params, batch, state, None)
    assert all(bool(jnp.abs(g).max() > 0) for g in jax.tree.leaves(grads))
    out = jax.jit(lambda p: arch.apply(p, batch, training=True, rng=None, model_state=state))(params)
    total, count = sums["loss"]

    def mean_ce(logits, at):
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"][:, at])
        mask = batch["loss_mask"][:, at]
        return (ce * mask).sum() / mask.sum()

    passes = [mean_ce(out.pass_logits[0], slice(None))]
    passes += [mean_ce(out.logits[:, i::n], slice(i, None, n)) for i in range(n)]
    # the loss by another formula (per-pass means, then their mean): a few fp32 roundings
    np.testing.assert_allclose(float(total / count), np.mean(passes), rtol=1e-6)
    one = build_architecture(resolve(_config(passes=(1,), pass_probs=(1.0,))), "lrt")
    assert arch.train_flops(16) == one.train_flops(16)


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(training="sequential"), "lrt.training must be one of"),
        (dict(interleaved_num_passes=0), "lrt.interleaved_num_passes must be >= 1"),
        (dict(thoughts=(0, 1)), r"lrt.thoughts=\(0, 1\) with lrt.training='interleaved': it has no thought"),
        (dict(feedback="none"), "lrt.feedback='none' with lrt.training='interleaved'"),
        (dict(supervise="last"), "lrt.supervise='last' with lrt.training='interleaved'"),
        (dict(interleaved_num_passes=17), r"interleaved_num_passes=17 exceeds data.seq_len \(16\)"),
        (dict(feedback="residual", interleaved_kv_refresh=True), "which feedback='residual' has not"),
        (dict(training="refinement", interleaved_kv_refresh=True), "a setting of lrt.training='interleaved'"),
    ],
)
def test_bad_interleaved_settings_are_one_clear_error(change, message):
    with pytest.raises(ValueError, match=message):
        build_architecture(resolve(_config(**{"training": "interleaved", **change})), "lrt")
