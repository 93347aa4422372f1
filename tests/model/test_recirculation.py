"""Recirculation on a tiny random model: the serial two-stack is a naive token-by-token reference of the
paper's semantics, alpha = 0 is the unmodified model bit for bit (every scheme), the parallel two-stack
reaches the serial one, decoding with the KV cache equals serial scoring, the single-stack is T²MLR's
recurrence with a parameter-free mixer, and bad settings are one clear error. fp32 equalities: the depth
rule of tests/tolerance.py, the depth by `two_stack_depth` (and test_recurrence's `chain` for the single
stack); the parallel two-stack stopped by its tolerance is held to that tolerance, not to round-off."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2mlr_jax.architectures.recirculation.forward import (
    TwoStackDecoder,
    looped_logits,
    single_stack_layout,
    single_stack_model,
    two_stack_parallel,
    two_stack_serial,
)
from t2mlr_jax.architectures.recirculation.mix import Recirculation
from t2mlr_jax.architectures.t2mlr import T2MLRDecoder
from t2mlr_jax.model import backbone
from t2mlr_jax.model.generate import generate_with
from t2mlr_jax.model.token_layout import make_layout
from t2mlr_jax.studies.parity import recurrence_layers
from tests.tiny import exact, jacobi, plain, tiny_config, tiny_params, tokens
from tests.tolerance import assert_fp32_close

CFG = tiny_config(recurrence=False, num_layers=5)
PARAMS = tiny_params(CFG)
SINGLE_PARAMS = {**PARAMS, "mixer": {}}  # the parameter-free mixer's (empty) table
TOKENS = tokens(2, 9)
RC = Recirculation(source=3, destination=1, alpha=0.5)

serial = jax.jit(two_stack_serial, static_argnums=(0, 2))


def two_stack_depth(rc: Recirculation, t: int) -> int:
    """Blocks on the two-stack's longest path over t tokens: a token's first pass through blocks d+1..s
    reads the earlier tokens' second-pass keys there, s - d blocks more per token (a Jacobi pass counts as
    a token); then its own first pass, the mix and its second pass."""
    return t * (rc.source - rc.destination) + CFG.num_layers + rc.source - rc.destination


parallel = jax.jit(two_stack_parallel, static_argnums=(0, 2), static_argnames=("tol", "max_passes"))


def _single(rc, mode):
    model = single_stack_model(CFG, rc)
    layout = single_stack_layout(make_layout(TOKENS))
    if mode == "exact":
        return exact(model, SINGLE_PARAMS, TOKENS, layout=layout).logits
    return jacobi(model, SINGLE_PARAMS, TOKENS, layout=layout, d_forward=TOKENS.shape[1], d_backward=0).logits


@functools.partial(jax.jit, static_argnums=1)
def _block(h, k):
    """Block k alone over a [B, T, D] stream (causal: row t reads rows 0..t only)."""
    positions, segment_ids = backbone.default_layout(TOKENS)
    return backbone.run_blocks(CFG, PARAMS, h, k, k + 1, positions=positions, segment_ids=segment_ids).h


def _naive_two_stack(rc: Recirculation, kept_in_window: str = "second"):
    """The two-stack written out token by token, no KV cache, from the model docstring: token t's first
    pass runs blocks 0..s; mix(its output at d, its output at s) seeds its second pass through blocks
    d+1..L-1, whose output predicts token t+1. At block k, token t attends to itself and to the input each
    earlier token left at block k: its first pass's in blocks 0..d, its second pass's in blocks d+1..L-1
    (`kept_in_window="first"`: the first pass's in d+1..s instead, the semantics the test rules out).
    kept[k][:, j] is token j's kept input to block k; the rows after t are placeholders row t never reads."""
    d, s, depth = rc.destination, rc.source, CFG.num_layers
    b, n = TOKENS.shape
    positions, _ = backbone.default_layout(TOKENS)
    kept = [np.zeros((b, n, CFG.hidden_size), np.float32) for _ in range(depth)]
    embedded = np.asarray(backbone.embed(CFG, PARAMS, TOKENS))
    mix = jax.jit(lambda z_dest, z_src, position: rc(z_dest, z_src, position))

    def block(k, t, x):  # token t's input x to block k -> its output, beside the earlier tokens' kept inputs
        stream = kept[k].copy()
        stream[:, t] = x
        return np.asarray(_block(jnp.asarray(stream), k))[:, t]

    outputs = []
    for t in range(n):
        first = [embedded[:, t]]  # first[k]: the first pass's input to block k (first[k + 1]: its output)
        for k in range(s + 1):
            first.append(block(k, t, first[k]))
        h = np.asarray(mix(first[d + 1][:, None], first[s + 1][:, None], positions[:, t : t + 1]))[:, 0]
        second = {}  # second[k]: the second pass's input to block k
        for k in range(d + 1, depth):
            second[k] = h
            h = block(k, t, h)
        for k in range(depth):
            first_kept = k <= d or (kept_in_window == "first" and k <= s)
            kept[k][:, t] = first[k] if first_kept else second[k]
        outputs.append(h)
    return np.asarray(backbone.head(CFG, PARAMS, jnp.asarray(np.stack(outputs, 1))))


@pytest.mark.numerics
def test_serial_two_stack_is_the_naive_token_by_token_reference():
    """Later tokens attend to the second-pass keys/values of earlier tokens in blocks d+1..L-1 (blocks
    2..4 of 5 here; 2..3 also hold a first pass), and the second pass's output predicts the next token."""
    exact, _ = serial(CFG, PARAMS, RC, TOKENS)
    assert_fp32_close(exact, _naive_two_stack(RC), two_stack_depth(RC, TOKENS.shape[1]), "serial")
    assert np.abs(np.asarray(exact) - _naive_two_stack(RC, kept_in_window="first")).max() > 1e-3


@pytest.mark.slow
def test_alpha_zero_is_the_unmodified_model_bit_for_bit():
    reference = plain(CFG, PARAMS, TOKENS)
    decoded = exact(CFG, PARAMS, TOKENS).logits  # the plain model token by token with the cache
    off = dataclasses.replace(RC, alpha=0.0)
    np.testing.assert_array_equal(serial(CFG, PARAMS, off, TOKENS)[0], decoded)
    np.testing.assert_array_equal(_single(off, "exact"), decoded)
    for scheme in ("ratio", "slerp"):  # every scheme's mix is the identity bitwise (test_recirculation_mix)
        rc = dataclasses.replace(off, scheme=scheme, ramp=scheme == "ratio")
        np.testing.assert_array_equal(parallel(CFG, PARAMS, rc, TOKENS).logits, reference)


@pytest.mark.numerics
def test_parallel_two_stack_converges_to_the_serial_one():
    exact, _ = serial(CFG, PARAMS, RC, TOKENS)
    assert float(jnp.max(jnp.abs(exact - plain(CFG, PARAMS, TOKENS)))) > 1e-2  # recirculation acts
    full = parallel(CFG, PARAMS, RC, TOKENS, tol=0.0, max_passes=TOKENS.shape[1])
    assert_fp32_close(full.logits, exact, two_stack_depth(RC, TOKENS.shape[1]), "T passes")
    assert int(full.passes) == TOKENS.shape[1]
    converged = parallel(CFG, PARAMS, RC, TOKENS, tol=1e-4, max_passes=64)
    assert 1 < int(converged.passes) <= TOKENS.shape[1] and float(converged.change) <= 1e-4
    np.testing.assert_allclose(converged.logits, exact, atol=1e-3)  # stopped at tol = 1e-4: not round-off
    one = parallel(CFG, PARAMS, RC, TOKENS, tol=0.0, max_passes=1)
    assert float(jnp.max(jnp.abs(one.logits - exact))) > 1e-3  # a single pass is not the two-stack


@pytest.mark.parametrize("prefill", ["serial", "parallel"])
def test_decoding_with_the_cache_equals_serial_scoring(prefill):
    prompt, n = TOKENS[:, :5], 6
    decoder = TwoStackDecoder(CFG, RC, prefill_mode=prefill, prefill_passes=8, prefill_tol=0.0)
    out = generate_with(decoder, PARAMS, prompt, jnp.ones_like(prompt), max_new_tokens=n)
    logits, _ = serial(CFG, PARAMS, RC, jnp.concatenate([prompt, out.tokens], axis=1))
    np.testing.assert_array_equal(jnp.argmax(logits[:, 4:-1], -1), out.tokens)


@pytest.mark.slow
@pytest.mark.numerics
def test_single_stack_is_t2mlr_with_a_parameter_free_mixer():
    by_token = _single(RC, "exact")
    depth = recurrence_layers(single_stack_model(CFG, RC), TOKENS.shape[1])
    assert_fp32_close(_single(RC, "jacobi"), by_token, depth, "jacobi")
    reference = plain(CFG, PARAMS, TOKENS)
    assert_fp32_close(by_token[:, 0], reference[:, 0], CFG.num_layers, "first token")  # untouched
    assert float(jnp.max(jnp.abs(by_token[:, 1:] - reference[:, 1:]))) > 1e-2
    prompt = TOKENS[:, :5]
    model = single_stack_model(CFG, RC)
    out = generate_with(T2MLRDecoder(model), SINGLE_PARAMS, prompt, jnp.ones_like(prompt), max_new_tokens=4)
    full = jnp.concatenate([prompt, out.tokens], axis=1)
    scored = exact(model, SINGLE_PARAMS, full, layout=single_stack_layout(make_layout(full))).logits
    np.testing.assert_array_equal(jnp.argmax(scored[:, 4:-1], -1), out.tokens)


@pytest.mark.numerics
def test_looping_control_reruns_the_recirculated_blocks():
    looped = looped_logits(CFG, PARAMS, RC, TOKENS)
    h = backbone.embed(CFG, PARAMS, TOKENS)
    kw = dict(zip(("positions", "segment_ids"), backbone.default_layout(TOKENS)))
    for start, end in ((0, 4), (2, 4), (4, 5)):
        h = backbone.run_blocks(CFG, PARAMS, h, start, end, **kw).h
    assert_fp32_close(looped, backbone.head(CFG, PARAMS, h), 4 + 2 + 1, "looped")  # the blocks run


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(source=1, destination=1), "must be deeper"),
        (dict(source=1, destination=3), "must be deeper"),
        (dict(source=5), "blocks 0..4"),
        (dict(destination=-1), "blocks 0..4"),
        (dict(alpha=1.5), r"\(0, 1\]"),
        (dict(alpha=0.0), r"\(0, 1\]"),
        (dict(scheme="ratios"), "scheme must be one of"),
    ],
)
def test_bad_settings_are_one_clear_error(changes, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(RC, **changes).check(CFG.num_layers)
    dataclasses.replace(RC, scheme="nonconvex", alpha=1.5).check(CFG.num_layers)  # beta = 1: any alpha > 0
