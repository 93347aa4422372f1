"""Looped transformers on an MoE backbone: the routing biases are carried (one slice per weight layer, the
looped layers' loads summed over the repeats), trained, and read by cached decoding (to the depth rule of
tests/tolerance.py: the 4 executed blocks)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from t2mlr_jax.architectures import build_architecture
from t2mlr_jax.architectures.baselines.looped import LoopedDecoder, looped_forward
from t2mlr_jax.experiment import resolve
from t2mlr_jax.model import moe
from t2mlr_jax.model.generate import teacher_forced
from t2mlr_jax.model.token_layout import make_layout
from t2mlr_jax.train.train_step import compile_step, init_state, model_inputs
from tests.tiny import NANOCHAT_BLOCK, tiny_experiment
from tests.tolerance import assert_fp32_close
from tests.train.tiny_task import tiny_batch

B, T, X = 2, 8, 4
LOOP = dict(start=1, end=1, repeats=3)  # layer 0 once, layer 1 three times: 4 layers unrolled


def _config(arch="middle_looped", **model):
    config = tiny_experiment(arch)
    config.model.update(num_layers=2, mlp="moe", moe_experts=X, moe_top_k=2, moe_dim=32, moe_bias_rate=0.01)
    # nanochat's per-layer parts: a repeated block must keep its own window, value embedding and scalars
    config.model.update(NANOCHAT_BLOCK)
    config.model.update(model)
    config.looped.update(LOOP)
    config.baseline.param_match = False
    return config


ARCH = build_architecture(resolve(_config()))
MODEL = ARCH.backbone
BATCH = model_inputs(jax.tree.map(jnp.asarray, tiny_batch(0, 1, B, T)))


@pytest.mark.slow
def test_a_train_step_moves_the_routing_biases_from_per_weight_layer_loads():
    state = init_state(ARCH, optax.sgd(0.1), seed=0)
    bias = state.model_state["mlp"]["router_bias"]
    assert bias.shape == (MODEL.num_layers, X) and not np.any(bias)
    stats = jax.jit(lambda p, s: ARCH.apply(p, BATCH, training=True, rng=None, model_state=s).stats)(
        state.params, state.model_state
    )["mlp"]
    # Every token picks top_k experts at each pass through a layer: layer 1 runs `repeats` times.
    np.testing.assert_array_equal(stats["load"].sum(-1), [B * T * 2, B * T * 2 * LOOP["repeats"]])
    want, _ = moe.moe_update_state(MODEL, state.model_state["mlp"], stats)

    step = compile_step(ARCH, optax.sgd(0.1), optax.constant_schedule(0.1))
    state, metrics = step(state, BATCH)
    bias = state.model_state["mlp"]["router_bias"]
    assert np.any(bias != 0)
    np.testing.assert_array_equal(bias, want["router_bias"])
    assert np.isfinite(float(metrics["loss"])) and "moe/imbalance" in metrics


@pytest.mark.slow
@pytest.mark.numerics
def test_decoding_reads_the_routing_biases_and_equals_the_looped_forward():
    params = ARCH.init(jax.random.PRNGKey(0))
    bias = {"router_bias": jax.random.normal(jax.random.PRNGKey(5), (MODEL.num_layers, X))}
    eval_model = MODEL.replace(moe_capacity_factor=None)  # as evaluation and decoding run it
    forward = jax.jit(lambda p, t, lay, s: looped_forward(eval_model, p, t, lay, mlp_state=s, **LOOP).logits)

    # The cached prefill (a cache layer per executed block) gives the looped forward's logits, and the
    # biases matter.
    tokens = jax.random.randint(jax.random.PRNGKey(1), (B, T), 1, MODEL.vocab_size)
    layout = make_layout(tokens)
    decoder = LoopedDecoder(eval_model, **LOOP)
    out = jax.jit(decoder.prefill)((params, bias), tokens, layout, decoder.init_cache(B, T))
    assert out.cache.k.shape[0] == 4  # layer 0 once, layer 1 three times
    want = forward(params, tokens, layout, bias)
    depth = LOOP["start"] + LOOP["repeats"] * (LOOP["end"] - LOOP["start"] + 1)  # 4 executed blocks
    assert_fp32_close(out.logits, want, depth, "prefill")
    unbiased = forward(params, tokens, layout, jax.tree.map(jnp.zeros_like, bias))
    assert np.abs(unbiased - want).max() > 1e-3
    # Cached steps after a 3-token prefill, fed the same tokens, give the same logits.
    decoded = teacher_forced(decoder, (params, bias), tokens, 3)
    assert_fp32_close(decoded, forward(params, tokens, make_layout(tokens), bias), depth, "decoded")

    # Greedy generation on left-padded prompts: each token is the argmax of the looped forward (with the
    # biases) on the prompt and the tokens before it.
    p, n = 5, T - 5 + 1
    prompt = tokens[:, :p].at[0, :2].set(0)
    mask = (jnp.arange(p)[None] >= jnp.asarray([[2], [0]])).astype(jnp.int32)
    generated = ARCH.generate(params, {"mlp": bias}, prompt, mask, None, n, None, 0).tokens
    full = jnp.concatenate([prompt, generated[:, :-1]], axis=1)
    real = jnp.concatenate([mask, jnp.ones((B, n - 1), jnp.int32)], axis=1)
    grown = make_layout(full, positions=jnp.maximum(jnp.cumsum(real, axis=1) - 1, 0), segment_ids=real)
    logits = forward(params, full, grown, bias)
    np.testing.assert_array_equal(jnp.argmax(logits[:, p - 1 :], axis=-1), generated)


def test_architectures_that_do_not_carry_the_state_refuse_a_stateful_mlp():
    with pytest.raises(ValueError, match="keeps routing state"):
        build_architecture(resolve(_config("transformer")))
    looped = build_architecture(resolve(_config("looped", mlp="relu2")))  # stateless: no state, no update
    assert looped.init_model_state() == {} and looped.update_model_state is None
