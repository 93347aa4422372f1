import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2mlr_jax.architectures import build_architecture
from t2mlr_jax.architectures.baselines.looped import looped_forward
from t2mlr_jax.architectures.baselines.lstm import lstm_forward, lstm_specs
from t2mlr_jax.architectures.baselines.pause import pause_forward, pause_specs
from t2mlr_jax.architectures.recompute import greedy_by_recompute
from t2mlr_jax.architectures.t2mlr import generate
from t2mlr_jax.experiment import resolve
from t2mlr_jax.model.backbone import forward
from t2mlr_jax.model.params import init_params
from t2mlr_jax.model.spec import init_from_specs
from t2mlr_jax.model.token_layout import make_layout
from tests.tiny import task_model, tiny_experiment
from tests.tolerance import assert_fp32_close

CFG = task_model()
PARAMS = init_params(CFG, jax.random.PRNGKey(0))
TOKENS = jax.random.randint(jax.random.PRNGKey(1), (2, 10), 1, CFG.vocab_size)


def assert_cached_is_recompute(cached_generate, logits_fn):
    """`cached_generate(prompt, mask)` (5 new tokens, EOS 3) gives the tokens and lengths of greedy decoding
    by re-running `logits_fn(params, tokens, layout)` on the whole sequence, on left-padded prompts."""
    prompt = TOKENS[:, :6].at[0, :2].set(0)
    mask = (jnp.arange(6)[None] >= jnp.asarray([[2], [0]])).astype(jnp.int32)
    cached = cached_generate(prompt, mask)
    recomputed = greedy_by_recompute(
        logits_fn, PARAMS, prompt, mask, None, max_new_tokens=5, eos_id=3, pad_id=0
    )
    np.testing.assert_array_equal(cached.tokens, recomputed.tokens)
    np.testing.assert_array_equal(cached.lengths, recomputed.lengths)


@pytest.mark.numerics
def test_looping_once_is_the_plain_transformer_and_twice_is_not():
    layout = make_layout(TOKENS)
    once = looped_forward(CFG, PARAMS, TOKENS, layout, start=0, end=-1, repeats=1).logits
    assert_fp32_close(once, forward(CFG, PARAMS, TOKENS), CFG.num_layers, "looped once")
    middle = looped_forward(CFG, PARAMS, TOKENS, layout, start=1, end=1, repeats=3).logits
    assert not np.allclose(middle, once, atol=1e-3)


def test_looped_decoding_with_a_cache_layer_per_executed_block_equals_recompute():
    """The architecture's cached greedy decoding equals decoding by re-running the looped forward, on
    left-padded prompts."""
    loop = dict(start=1, end=1, repeats=3)
    config = tiny_experiment("looped")
    config.looped.update(start=1, end=1, repeats=3)
    config.baseline.param_match = False
    arch = build_architecture(resolve(config))
    assert_cached_is_recompute(
        lambda prompt, mask: arch.generate(PARAMS, {}, prompt, mask, None, 5, 3, 0),
        lambda p, t, lay: looped_forward(CFG, p, t, lay, **loop).logits,
    )


@pytest.mark.numerics
def test_pause_tokens_are_causal_and_read_at_the_last_pause():
    params = init_from_specs(pause_specs(CFG), jax.random.PRNGKey(2), "float32")
    logits = pause_forward(CFG, params, TOKENS, make_layout(TOKENS), num_pause=2)
    assert logits.shape == (2, 10, CFG.vocab_size)
    changed = TOKENS.at[:, 6].set(TOKENS[:, 6] % (CFG.vocab_size - 1) + 1)
    again = pause_forward(CFG, params, changed, make_layout(changed), num_pause=2)
    assert_fp32_close(
        again[:, :6], logits[:, :6], CFG.num_layers, "before the change"
    )  # pause slots: no chain
    assert not np.allclose(again[:, 6], logits[:, 6])


@pytest.mark.numerics
def test_lstm_state_resets_at_document_starts():
    params = init_from_specs(
        lstm_specs(vocab_size=CFG.vocab_size, hidden=16, layers=2), jax.random.PRNGKey(3), "float32"
    )
    a, b = TOKENS[0, :4], TOKENS[1, :6]
    packed = jnp.concatenate([a, b])[None]
    layout = make_layout(
        packed,
        positions=jnp.concatenate([jnp.arange(4), jnp.arange(6)])[None],
        segment_ids=jnp.asarray([[1] * 4 + [2] * 6]),
    )
    alone = lstm_forward(params, b[None], make_layout(b[None]))
    # the LSTM's chain: 6 steps x 2 layers
    assert_fp32_close(lstm_forward(params, packed, layout)[:, 4:], alone, 6 * 2, "the second document")


def test_decoding_by_recompute_equals_kv_cache_generation_on_left_padded_prompts():
    assert_cached_is_recompute(
        lambda prompt, mask: generate(CFG, PARAMS, prompt, mask, max_new_tokens=5, eos_id=3),
        lambda p, t, lay: forward(CFG, p, t, positions=lay.positions, segment_ids=lay.segment_ids),
    )


def test_param_matched_baseline_is_the_narrowest_width_at_or_above_t2mlr():
    config = tiny_experiment("transformer")
    target = build_architecture(resolve(config), "t2mlr").num_params()
    matched = build_architecture(resolve(config), "transformer")
    assert matched.num_params() >= target
    config.baseline.param_match = False
    config.model.hidden_size = matched.backbone.hidden_size - config.baseline.width_multiple
    assert build_architecture(resolve(config), "transformer").num_params() < target
