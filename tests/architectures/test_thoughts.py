"""Latent thought slots (LRT-TTK) and PonderLM-2: cached decoding == the parallel expanded forward after
enough refinement passes (fp32, 1e-5); K = 0 is the plain LRT; generation with a (K + 1)x cache; a sampled-K
run evaluates at another K; every bad thought setting one clear error before compiling."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2mlr_jax.architectures import lrt, thought_slots
from t2mlr_jax.model import generate as generation
from t2mlr_jax.model.recurrence import make_layout
from t2mlr_jax.train.init_from import architecture
from tests.architectures.test_lrt import LAYOUT, NANO, STATE, TOKS, _params, exact, refine
from tests.train.tiny_task import tiny_config

TT = lrt.LRTConfig(NANO, thought_slots=True)
PONDER = lrt.LRTConfig(NANO, feedback="none", thought_slots=True, cross_token=False)
PARAMS = _params(TT)
N = 4  # vocabulary tokens: row 1 holds a document start at its 4th token (LAYOUT)
TOKS4 = TOKS[:, :N]
LAYOUT4 = make_layout(
    TOKS4, positions=LAYOUT.positions[:, :N], segment_ids=LAYOUT.segment_ids[:, :N]
)  # fmt: skip
refine_k = jax.jit(
    lambda cfg, p, t, layout, n, k: lrt.refine(cfg, p, t, layout, n, STATE, k), static_argnums=(0, 4, 5)
)
exact_k = jax.jit(
    lambda cfg, p, t, layout, k: lrt.exact_forward(cfg, p, t, layout, mlp_state=STATE, thoughts=k),
    static_argnums=(0, 4),
)


@pytest.mark.parametrize("cfg,k", [(TT, 2), (PONDER, 1)], ids=["lrt_tt2", "ponderlm2_k1"])
def test_cached_decoding_equals_enough_parallel_refinement_passes(cfg, k):
    want = exact_k(cfg, PARAMS, TOKS4, LAYOUT4, k).logits
    passes = refine_k(cfg, PARAMS, TOKS4, LAYOUT4, N * (k + 1), k).logits
    np.testing.assert_allclose(passes[-1], want, atol=1e-5, rtol=1e-5)
    assert np.abs(passes[0] - want).max() > 1e-3  # one refinement is not yet the recurrence


def test_thought_count_zero_is_the_plain_lrt():
    plain = dataclasses.replace(TT, thought_slots=False)
    weights = {**PARAMS, "lrt": {k: v for k, v in PARAMS["lrt"].items() if not k.endswith("_thought")}}
    np.testing.assert_allclose(
        exact_k(TT, PARAMS, TOKS, LAYOUT, 0).logits,
        exact(plain, weights, TOKS, LAYOUT, STATE).logits,
        atol=1e-6,
    )
    # The thought model's initialisation pass + P refinements are the plain LRT's P + 1 passes.
    np.testing.assert_allclose(
        refine_k(TT, PARAMS, TOKS, LAYOUT, 2, 0).logits[-1],
        refine(plain, weights, TOKS, LAYOUT, 3, STATE).logits[-1],
        atol=1e-6,
    )


def test_thought_gates_are_their_own():
    """Zeroing the thought slots' gamma changes the thought slots' computation only, so K = 0 is unmoved."""
    moved = {**PARAMS, "lrt": {**PARAMS["lrt"], "gamma_thought": jnp.zeros_like(PARAMS["lrt"]["gamma"])}}
    np.testing.assert_array_equal(exact_k(TT, moved, TOKS4, LAYOUT4, 0).logits,
                                  exact_k(TT, PARAMS, TOKS4, LAYOUT4, 0).logits)  # fmt: skip
    assert (
        np.abs(
            exact_k(TT, moved, TOKS4, LAYOUT4, 1).logits - exact_k(TT, PARAMS, TOKS4, LAYOUT4, 1).logits
        ).max()
        > 1e-4
    )


def test_generation_with_thought_slots_follows_the_recurrence():
    prompt, n, k = TOKS[:, :3], 3, 2
    out = generation.generate_with(
        lrt.LRTDecoder(TT, k), (PARAMS, {"mlp": STATE}), prompt, jnp.ones_like(prompt), max_new_tokens=n
    )
    full = jnp.concatenate([prompt, out.tokens[:, :-1]], axis=1)
    logits = exact_k(TT, PARAMS, full, make_layout(full), k).logits
    np.testing.assert_array_equal(jnp.argmax(logits[:, 2:], axis=-1), out.tokens)


def test_expanded_layout_shares_positions_and_starts_documents_at_vocabulary_slots():
    slots = thought_slots.expand(TOKS4, LAYOUT4, 1)
    np.testing.assert_array_equal(slots.layout.positions[1], [0, 0, 1, 1, 2, 2, 0, 0])
    np.testing.assert_array_equal(slots.tokens[0, 1::2], [thought_slots.LATENT] * N)
    np.testing.assert_array_equal(slots.starts[1], [1, 0, 0, 0, 0, 0, 1, 0])


def _tt_config(**lrt_settings):
    config = tiny_config("lrt", steps=2)
    config.data.seq_len = 24
    config.lrt.thoughts = (0, 1, 2)
    for key, value in lrt_settings.items():
        config.lrt[key] = value
    return config


@pytest.mark.parametrize(
    "arch,change,message",
    [
        ("lrt", {"lrt.thoughts": (0, -1)}, r"lrt.thoughts: a thought count K must be an integer >= 0"),
        ("lrt", {"eval.thoughts": -1}, r"eval.thoughts: a thought count K must be an integer >= 0"),
        ("lrt", {"data.seq_len": 20}, r"a row of 20 slots does not split into whole intervals of K \+ 1 = 3"),
        ("lrt", {"lrt.thoughts": (0,), "eval.thoughts": 2}, "this lrt has no thought slots"),
        ("looped", {"eval.thoughts": 1}, "architecture 'looped' has no latent thought slots"),
        ("transformer", {"eval.thoughts": 2}, "architecture 'transformer' has no latent thought slots"),
    ],
)
def test_bad_thought_settings_are_one_clear_error(arch, change, message):
    config = _tt_config()
    config.arch = arch
    for path, value in change.items():
        section, field = path.split(".")
        config[section][field] = value
    with pytest.raises(ValueError, match=message):
        architecture(config, arch)


def test_sampled_thoughts_train_and_evaluate_at_another_k(tmp_path):
    """A row trained with K in {0, 1, 2} resumes its workdir and evaluates at K = 3 (eval is not part of
    the run's identity; the training step is not rebuilt), every step logging its K and P."""
    import json

    from t2mlr_jax.train.trainer import Run, restore_state, run_eval, train
    from tests.train.tiny_task import tiny_source

    config = _tt_config()
    config.lrt.passes, config.lrt.pass_probs = (1, 2), (0.5, 0.5)
    config.train.log_every = 1
    summary = train(Run(config, tmp_path, tiny_source(seq_len=24), "lrt"))
    assert summary["flops_per_step"] > 0 and summary["train_flops"] == 2 * summary["flops_per_step"]
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all({"thoughts", "passes"} <= set(r) for r in logged if r.get("split") == "train")
    config.eval.thoughts = 3
    run = Run(config, tmp_path, tiny_source(seq_len=24), "lrt")
    state, step = restore_state(run)
    metrics = run_eval(run, state.params, state.model_state)
    assert step == 2 and np.isfinite(metrics["loss"]) and metrics["loss"] != summary["eval"]["loss"]
