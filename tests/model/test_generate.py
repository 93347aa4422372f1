"""Generation: greedy equals the exact forward's argmax, left padding is invisible, EOS stops rows."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2mlr_jax.architectures.t2mlr import generate
from t2mlr_jax.model.backbone import unstack_layers
from t2mlr_jax.model.generate import sample
from tests.tiny import exact, tiny_config, tiny_params, tokens

CFG = tiny_config()
PARAMS = tiny_params(CFG, gamma=0.8)
N = 6


def test_greedy_generation_equals_the_exact_forward_argmax():
    prompt = tokens(2, 5)
    out = generate(CFG, PARAMS, prompt, jnp.ones_like(prompt), max_new_tokens=N)
    full = jnp.concatenate([prompt, out.tokens], axis=1)
    logits = exact(CFG, PARAMS, full).logits
    np.testing.assert_array_equal(jnp.argmax(logits[:, 4:-1], -1), out.tokens)
    np.testing.assert_array_equal(out.lengths, [N, N])


@pytest.mark.slow
def test_left_padded_batch_equals_rows_alone():
    lengths = [5, 2]
    rows = [tokens(1, n, seed=20 + i) for i, n in enumerate(lengths)]
    prompt = jnp.concatenate([jnp.pad(r, ((0, 0), (5 - r.shape[1], 0))) for r in rows])
    mask = jnp.array([[0] * (5 - n) + [1] * n for n in lengths])
    for prefill in ("exact", "jacobi"):
        batch = generate(CFG, PARAMS, prompt, mask, max_new_tokens=N, prefill=prefill, prefill_passes=5)
        for i, r in enumerate(rows):
            alone = generate(
                CFG, PARAMS, r, jnp.ones_like(r), max_new_tokens=N, prefill=prefill, prefill_passes=5
            )
            np.testing.assert_array_equal(batch.tokens[i], alone.tokens[0])


@pytest.mark.slow
def test_by_jacobi_is_exact_with_enough_passes_and_differs_with_one():
    prompt = tokens(2, 10)
    mask = jnp.ones_like(prompt)
    by_exact = generate(CFG, PARAMS, prompt, mask, max_new_tokens=N)
    by_jacobi = generate(CFG, PARAMS, prompt, mask, max_new_tokens=N, prefill="jacobi", prefill_passes=10)
    np.testing.assert_array_equal(by_exact.tokens, by_jacobi.tokens)
    generate(CFG, PARAMS, prompt, mask, max_new_tokens=2, prefill="jacobi", prefill_passes=1)  # k = 1 works


@pytest.mark.slow
def test_unstacked_weights_decode_the_same_without_copying_weights_or_cache():
    """`generate` takes params unstacked once (`unstack_layers`) and then holds no copy of the layer
    stack (a stacked call's temporaries hold one more), with the same tokens for both prefills; each
    token's keys and values go into the cache in place (no copy of the cache in the program)."""
    prompt, mask = tokens(2, 5), jnp.ones((2, 5), jnp.int32)
    weights = jax.jit(unstack_layers, static_argnums=0)(CFG, PARAMS)
    for prefill in ("exact", "jacobi"):
        run = lambda p, prefill=prefill: generate(CFG, p, prompt, mask, max_new_tokens=N, prefill=prefill)
        np.testing.assert_array_equal(run(weights).tokens, run(PARAMS).tokens)
    programs = {
        name: jax.jit(lambda p: generate(CFG, p, prompt, mask, max_new_tokens=N).tokens).lower(p).compile()
        for name, p in (("stacked", PARAMS), ("unstacked", weights))
    }
    temps = {name: c.memory_analysis().temp_size_in_bytes for name, c in programs.items()}
    layer_bytes = sum(leaf.nbytes for leaf in jax.tree.leaves(PARAMS["layers"]))
    assert temps["stacked"] - temps["unstacked"] >= layer_bytes, (temps, layer_bytes)
    cache_shape = ",".join(map(str, (CFG.num_layers, 2, 5 + N, CFG.num_kv_heads, CFG.head_dim)))
    in_loops = programs["unstacked"].as_text().split("\nENTRY")[0]  # the entry (one zero cache) is last
    cache_copies = re.findall(rf"= f32\[{cache_shape}\]\{{[\d,]*\}} copy\(", in_loops)
    assert not cache_copies, cache_copies


def test_eos_stops_each_row():
    prompt = tokens(2, 5)
    greedy = generate(CFG, PARAMS, prompt, jnp.ones_like(prompt), max_new_tokens=N)
    eos = int(greedy.tokens[0, 2])
    out = generate(CFG, PARAMS, prompt, jnp.ones_like(prompt), max_new_tokens=N, eos_id=eos, pad_id=0)
    first = int(np.argmax(np.asarray(greedy.tokens[0]) == eos))
    assert int(out.lengths[0]) == first + 1
    np.testing.assert_array_equal(out.tokens[0, : first + 1], greedy.tokens[0, : first + 1])
    assert (np.asarray(out.tokens[0, first + 1 :]) == 0).all()


def test_sampling_filters():
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]] * 512))
    key = jax.random.PRNGKey(0)
    np.testing.assert_array_equal(sample(logits, key, 1.0, top_k=1), 0)
    drawn = np.asarray(sample(logits, key, 1.0, top_p=0.7))
    assert set(drawn.tolist()) == {0, 1}
    drawn = np.asarray(sample(logits, key, 1.0, top_k=3))
    assert set(drawn.tolist()) == {0, 1, 2}


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(prefill="parallel"), "prefill"),
        (dict(prefill_passes=0), "d_forward"),
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(top_p=0.0), "top_p"),
        (dict(temperature=1.0), "key"),
    ],
)
def test_bad_generation_arguments(kwargs, field):
    prompt = tokens(1, 3)
    args = dict(max_new_tokens=2) | kwargs
    with pytest.raises(ValueError, match=field):
        generate(CFG, PARAMS, prompt, jnp.ones_like(prompt), **args)
