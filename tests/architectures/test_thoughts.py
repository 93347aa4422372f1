"""Latent thought slots (LRT-TTK) and PonderLM-2: cached decoding == the parallel expanded forward after
enough refinement passes (fp32 round-off: the float64 rule of tests/tolerance.py against the naive
recurrence of tests/reference.py; other fp32 pairs the depth rule, passes x layers or slots x layers);
K = 0 is the plain LRT; generation with a (K + 1)x cache; a sampled-K
run evaluates at another K without rebuilding its train step; the loss over the refinement passes, the fixed
expanded row, the thought gates, the ablations (Table 3's rows) and PonderLM-2's builder; every bad thought
setting one clear error before compiling."""

import dataclasses
import math
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2mlr_jax.architectures import ARCHITECTURES, build_architecture
from t2mlr_jax.architectures.lrt import architecture as lrt
from t2mlr_jax.architectures.lrt import forward as lrt_forward
from t2mlr_jax.architectures.lrt import thought_slots
from t2mlr_jax.experiment import resolve
from t2mlr_jax.model import backbone
from t2mlr_jax.model import generate as generation
from t2mlr_jax.model.token_layout import Layout, Output, make_layout
from t2mlr_jax.studies.parity import max_abs_diff
from tests import reference
from tests.architectures.test_lrt import LAYOUT, NANO, STATE, TOKS, B, _params, exact, refine
from tests.tiny import tiny_experiment
from tests.tolerance import assert_fp32_close, assert_near_f64
from tests.train.test_build_data import load_config
from tests.train.tiny_task import tiny_batch

TT = lrt_forward.LRTConfig(NANO, thought_slots=True)
PONDER = lrt_forward.LRTConfig(NANO, feedback="none", thought_slots=True, cross_token=False)
NO_KV = lrt_forward.LRTConfig(NANO, feedback="residual", thought_slots=True)  # Table 3's "w/o KV feedback"
NO_CROSS = lrt_forward.LRTConfig(NANO, thought_slots=True, cross_token=False)  # "w/o cross-token recurrence"
PARAMS = _params(TT)
N = 4  # vocabulary tokens: row 1 holds a document start at its 4th token (LAYOUT)
TOKS4 = TOKS[:, :N]
LAYOUT4 = make_layout(
    TOKS4, positions=LAYOUT.positions[:, :N], segment_ids=LAYOUT.segment_ids[:, :N]
)  # fmt: skip
refine_k = jax.jit(
    lambda cfg, p, t, layout, n, k: lrt_forward.refine(cfg, p, t, layout, n, STATE, k),
    static_argnums=(0, 4, 5),
)
exact_k = jax.jit(
    lambda cfg, p, t, layout, k: lrt_forward.exact_forward(cfg, p, t, layout, mlp_state=STATE, thoughts=k),
    static_argnums=(0, 4),
)


def _weights(cfg):
    """PARAMS with the LRT entries that `cfg` has (the residual-only ablation: gamma and gamma_thought)."""
    return {**PARAMS, "lrt": {k: PARAMS["lrt"][k] for k in lrt_forward.lrt_specs(cfg).get("lrt", {})}}


def _truth(cfg, params, layout, k):
    """The float64 logits of the naive reference (tests/reference.py) on TOKS4."""
    return reference.lrt(
        cfg, reference.f64(params), TOKS4, layout, thoughts=k, mlp_state=reference.f64(STATE)
    )


@pytest.mark.slow
@pytest.mark.numerics
@pytest.mark.parametrize(
    "cfg,k",
    [(TT, 2), (PONDER, 1), (NO_KV, 1), (NO_CROSS, 1)],
    ids=["lrt_tt2", "ponderlm2_k1", "residual_feedback_k1", "no_cross_token_k1"],
)
def test_cached_decoding_equals_enough_parallel_refinement_passes(cfg, k):
    """Each path within the float64 rule (tests/tolerance.py) of the naive reference, measured against the
    exact recurrence's own fp32 error; the path is N(K + 1) slots of NANO's layers deep."""
    params, depth = _weights(cfg), N * (k + 1) * NANO.num_layers
    want = exact_k(cfg, params, TOKS4, LAYOUT4, k).logits
    passes = refine_k(cfg, params, TOKS4, LAYOUT4, N * (k + 1), k).logits
    assert len(passes) == N * (k + 1)  # one logits per refinement pass: the initialisation pass has none
    assert_near_f64(passes[-1], want, _truth(cfg, params, LAYOUT4, k), depth, "refinement passes")
    assert max_abs_diff(passes[0], want) > 1e-3  # one refinement is not yet the recurrence
    # Cached decoding, fed the same tokens (a 2-token prompt, then one per step; one document per row, as
    # generation runs), gives the exact recurrence's logits.
    decoded = generation.teacher_forced(lrt_forward.LRTDecoder(cfg, k), (params, {"mlp": STATE}), TOKS4, 2)
    want = exact_k(cfg, params, TOKS4, make_layout(TOKS4), k).logits
    assert_near_f64(decoded, want, _truth(cfg, params, make_layout(TOKS4), k), depth, "cached decoding")


@pytest.mark.numerics
def test_the_float64_rule_fails_a_planted_bug():
    """The bound above, on lrt_tt2, fails a planted bug: the thought slots' KV gate moved by 1e-4 of its
    weights moves the logits by far less than any structural mistake, and still by more than the bound."""
    moved = {**PARAMS, "lrt": {**PARAMS["lrt"], "gate_thought": PARAMS["lrt"]["gate_thought"] * (1 + 1e-4)}}
    want, truth = exact_k(TT, PARAMS, TOKS4, LAYOUT4, 2).logits, _truth(TT, PARAMS, LAYOUT4, 2)
    with pytest.raises(AssertionError, match="planted"):
        assert_near_f64(exact_k(TT, moved, TOKS4, LAYOUT4, 2).logits, want, truth, N * 3 * 3, "planted")


@pytest.mark.numerics
def test_thought_count_zero_is_the_plain_lrt():
    plain = dataclasses.replace(TT, thought_slots=False)
    weights = {**PARAMS, "lrt": {k: v for k, v in PARAMS["lrt"].items() if not k.endswith("_thought")}}
    want = exact(plain, weights, TOKS, LAYOUT, STATE).logits
    truth = reference.lrt(plain, reference.f64(weights), TOKS, LAYOUT, mlp_state=reference.f64(STATE))
    t = TOKS.shape[1]  # the memory through the row's tokens
    assert_near_f64(exact_k(TT, PARAMS, TOKS, LAYOUT, 0).logits, want, truth, t * NANO.num_layers, "K = 0")
    # The thought model's initialisation pass + P refinements are the plain LRT's pass 0 + P refinements
    # (two programs: fp32 round-off apart, 1 + P = 3 passes deep).
    assert_fp32_close(
        refine_k(TT, PARAMS, TOKS, LAYOUT, 2, 0).logits[-1],
        refine(plain, weights, TOKS, LAYOUT, 2, STATE).logits[-1],
        3 * NANO.num_layers,
        "refined",
    )


@pytest.mark.parametrize("name", ["gamma", "gate"])
def test_thought_gates_are_their_own(name):
    """Zeroing the thought slots' gamma (or KV gate W_g: gates 1) changes the thought slots' computation
    only, so K = 0 is unmoved."""
    moved = {**PARAMS, "lrt": {**PARAMS["lrt"], name + "_thought": jnp.zeros_like(PARAMS["lrt"][name])}}
    np.testing.assert_array_equal(exact_k(TT, moved, TOKS4, LAYOUT4, 0).logits,
                                  exact_k(TT, PARAMS, TOKS4, LAYOUT4, 0).logits)  # fmt: skip
    assert (
        np.abs(
            exact_k(TT, moved, TOKS4, LAYOUT4, 1).logits - exact_k(TT, PARAMS, TOKS4, LAYOUT4, 1).logits
        ).max()
        > 1e-4
    )


@pytest.mark.slow
def test_generation_with_thought_slots_follows_the_recurrence():
    prompt, n, k = TOKS[:, :3], 3, 2
    out = generation.generate_with(
        lrt_forward.LRTDecoder(TT, k),
        (PARAMS, {"mlp": STATE}),
        prompt,
        jnp.ones_like(prompt),
        max_new_tokens=n,
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
    config = tiny_experiment("lrt", steps=2)
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
        build_architecture(resolve(config), arch)


@pytest.mark.slow
def test_sampled_thoughts_train_and_evaluate_at_another_k(tmp_path, monkeypatch):
    """A row trained with K in {0, 1, 2} resumes its workdir and evaluates at K = 3 (eval is not part of
    the run's identity; the training step is not rebuilt), every step logging its K and P. Counted: the
    trainer builds one train step per distinct (K, P) drawn, and the evaluation at K = 3 builds none and
    traces no training pass (lrt.refine)."""
    import json

    from t2mlr_jax.train import programs, trainer
    from tests.train.tiny_task import tiny_source

    built, traced = [], []
    compile_step, refine_passes = programs.compile_step, lrt.refine
    monkeypatch.setattr(
        programs, "compile_step", lambda *a, **kw: built.append(kw["sample"]) or compile_step(*a, **kw)
    )
    monkeypatch.setattr(lrt, "refine", lambda *a: traced.append(a[4:]) or refine_passes(*a))
    config = _tt_config()
    config.lrt.passes, config.lrt.pass_probs = (1, 2), (0.5, 0.5)
    config.train.log_every = 1
    run = trainer.Run(resolve(config), tmp_path, tiny_source(seq_len=24), "lrt")
    summary = trainer.train(run)
    assert summary["flops_per_step"] > 0 and summary["train_flops"] == 2 * summary["flops_per_step"]
    assert sorted(built) == sorted({run.arch.sample(config.seed, step) for step in (1, 2)}) and traced
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all({"thoughts", "passes"} <= set(r) for r in logged if r.get("split") == "train")
    built.clear(), traced.clear()
    config.eval.thoughts = 3
    run = trainer.Run(resolve(config), tmp_path, tiny_source(seq_len=24), "lrt")
    state, step = trainer.restore_state(run)
    metrics = trainer.run_eval(run, state.params, state.model_state)
    assert step == 2 and np.isfinite(metrics["loss"]) and metrics["loss"] != summary["eval"]["loss"]
    assert built == [] and traced == []  # nothing of the training step is built or traced again


def test_the_thought_kv_gate_acts_on_thought_slots_only():
    """One layer's KV feedback (`_kv`): the thought gate W_g moves the keys / values of thought slots and of
    no vocabulary slot; a call without thought slots (pass 0) never reads it."""
    lrt_params = {name: w[0] for name, w in PARAMS["lrt"].items()}  # layer 0's
    keys = jax.random.split(jax.random.PRNGKey(7), 4)
    x, m = (jax.random.normal(key, (B, 6, NANO.hidden_size)) for key in keys[:2])
    k, v = (jax.random.normal(key, (B, 6, NANO.num_kv_heads, NANO.head_dim)) for key in keys[2:])
    thought = jnp.broadcast_to(jnp.arange(6) % 3 != 0, (B, 6))  # K = 2
    moved = {**lrt_params, "gate_thought": jnp.zeros_like(lrt_params["gate_thought"])}
    with_slots = {"m": m, "thought": thought}
    diff = np.abs(
        np.stack(lrt_forward._kv(moved, with_slots, x, k, v))
        - np.stack(lrt_forward._kv(lrt_params, with_slots, x, k, v))
    )
    assert diff[:, ~np.asarray(thought)].max() == 0 and diff[:, np.asarray(thought)].min() > 0
    np.testing.assert_array_equal(np.stack(lrt_forward._kv(moved, {"m": m}, x, k, v)),
                                  np.stack(lrt_forward._kv(lrt_params, {"m": m}, x, k, v)))  # fmt: skip


@pytest.mark.numerics
def test_without_cross_token_feedback_vocabulary_slots_get_zero_memory(monkeypatch):
    """lrt.cross_token=False with the feedback on: every refinement pass (and the decode step) gives the
    vocabulary slots zero memory and each thought slot the previous slot's state, as with cross_token=True
    (whose vocabulary slots get the previous interval's last state). The backbone pass is stubbed: what is
    checked is the memory each slot is given."""
    calls = []

    def stub(cfg, params, h, tokens, layout, m, thought, mlp_state, cache=None):
        calls.append((m, thought))
        states = h + 1.0 + jnp.arange(h.shape[1], dtype=h.dtype)[:, None]  # distinct, nonzero states
        return states, types.SimpleNamespace(stats={}, cache=cache)

    monkeypatch.setattr(lrt_forward, "_run", stub)
    k, slots = 1, thought_slots.expand(TOKS4, LAYOUT4, 1)
    thought = np.asarray(slots.thought)
    vocab_after_first = ~thought & ~np.asarray(slots.starts)  # vocabulary slots with a previous interval
    for cross in (True, False):
        cfg = dataclasses.replace(TT, cross_token=cross)
        calls.clear()
        lrt_forward.refine(cfg, PARAMS, TOKS4, LAYOUT4, 2, STATE, k)
        assert len(calls) == 3 and calls[0][1] is None and not np.asarray(calls[0][0]).any()  # pass 0: m = 0
        # pass 0's states
        previous = lrt_forward.vocab_inputs(cfg, PARAMS, TOKS4) + 1.0 + jnp.arange(N)[:, None]
        previous = jnp.repeat(previous, k + 1, axis=1)
        for m, slot_is_thought in calls[1:]:
            m = np.asarray(m)
            np.testing.assert_array_equal(slot_is_thought, thought)
            shifted = np.asarray(thought_slots.shift(previous, slots.starts))
            # the stub's states, shifted: arithmetic of one op (depth 1)
            assert_fp32_close(m[thought], shifted[thought], 1, "thought slots")  # thought slots keep theirs
            if cross:
                assert_fp32_close(m[vocab_after_first], shifted[vocab_after_first], 1, "vocabulary slots")
                assert np.abs(m[vocab_after_first]).min() > 0
            else:
                assert not m[~thought].any()
            h = jnp.where(jnp.asarray(thought)[..., None], jnp.asarray(shifted), jnp.repeat(
                lrt_forward.vocab_inputs(cfg, PARAMS, TOKS4), k + 1, axis=1))  # fmt: skip
            previous = h + 1.0 + jnp.arange(N * (k + 1))[:, None]
        # Decoding token 1 (not a document start) of a row whose memory is 1 (jit off: the thought slots'
        # loop runs in Python, so its memory is concrete too).
        calls.clear()
        memory, cache = jnp.ones((B, NANO.hidden_size)), backbone.init_cache(NANO, B, k + 1)
        layout = Layout(*(jnp.ones((B, 1), jnp.int32) for _ in range(3)))
        with jax.disable_jit():
            lrt_forward.decode_step(cfg, PARAMS, TOKS4[:, 1:2], memory, cache, layout, STATE, k)
        (m_vocab, is_thought), (m_thought, _) = calls
        np.testing.assert_array_equal(m_vocab, jnp.ones_like(m_vocab) * cross)
        assert not is_thought.any() and np.abs(np.asarray(m_thought)).min() > 0


class _Stub:
    """Stands in for lrt.refine / lrt.exact_forward inside a built Architecture's apply: records what the
    model would run (its LRTConfig, vocabulary tokens, layout, P, K) and returns distinct random logits,
    one per refinement pass, so that apply's wiring and the loss are checked without running a model."""

    def __init__(self):
        self.calls = []

    def refine(self, cfg, params, tokens, layout, refinements, mlp_state=None, thoughts=0):
        keys = jax.random.split(jax.random.PRNGKey(refinements), refinements)
        logits = tuple(3 * jax.random.normal(key, tokens.shape + (cfg.model.vocab_size,)) for key in keys)
        self.calls.append(
            dict(run="parallel", cfg=cfg, tokens=tokens, layout=layout, thoughts=thoughts, logits=logits)
        )
        return lrt_forward.Passes(logits, {})

    def exact_forward(self, cfg, params, tokens, layout, *, cache=None, mlp_state=None, thoughts=0):
        self.calls.append(dict(run="exact", cfg=cfg, tokens=tokens, thoughts=thoughts))
        b, t = tokens.shape
        return Output(
            jnp.zeros((b, t, cfg.model.vocab_size)), jnp.zeros((b, cfg.model.hidden_size)), {}, None
        )


@pytest.fixture
def stub(monkeypatch):
    spy = _Stub()
    monkeypatch.setattr(lrt, "refine", spy.refine)
    monkeypatch.setattr(lrt, "exact_forward", spy.exact_forward)
    return spy


ROW = 24  # data.seq_len: slots per training row
BATCH = {name: jnp.asarray(a) for name, a in tiny_batch(0, 1, 2, ROW).items()}  # padded rows: a masked tail


def _built(arch="lrt", seq_len=ROW, **section):
    config = tiny_experiment(arch, steps=2)
    config.data.seq_len, config.baseline.param_match = seq_len, False
    for key, value in section.items():
        config[arch][key] = value
    return build_architecture(resolve(config), arch)


def _apply(arch, batch=BATCH, draw=None):
    kwargs = dict(rng=jax.random.PRNGKey(0), model_state={})
    if draw is None:
        return arch.apply({}, batch, training=False, **kwargs)
    return arch.apply({}, batch, training=True, sample=draw, **kwargs)


def _cross_entropy(logits, batch):
    """Mean next-token cross-entropy over the supervised positions of the batch's first T tokens, by hand."""
    n = logits.shape[1]
    logp = np.asarray(jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1))
    targets, mask = np.asarray(batch["targets"][:, :n]), np.asarray(batch["loss_mask"][:, :n])
    nll = -np.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return (nll * mask).sum() / mask.sum()


@pytest.mark.parametrize(
    "arch,section,supervise",
    [
        ("lrt", {"thoughts": (0, 1, 2)}, "all"),
        ("lrt", {"thoughts": (1,), "supervise": "last"}, "last"),
        ("ponderlm2", {"thoughts": (1,)}, "last"),
    ],
    ids=["lrt_all", "lrt_last", "ponderlm2"],
)
def test_the_loss_averages_the_refinement_passes_or_reads_the_last(stub, arch, section, supervise):
    """A thought model at (K, P) = (1, 3): Outputs carry P logits, the refinement passes' (the initialisation
    pass is unsupervised), the last as `logits`; the loss is the mean of their cross-entropies (supervise
    "all") or the last one's ("last", PonderLM-2's), read on the row's N = T / (K + 1) vocabulary tokens."""
    model = _built(arch, **section)
    out = _apply(model, draw=lrt.Draw(1, 3))
    ran = stub.calls[-1]["logits"]  # the P refinement passes' logits
    assert len(ran) == 3 and len(out.pass_logits) == 2 and out.logits is ran[-1]
    assert all(a is b for a, b in zip(out.pass_logits, ran))
    per_pass = [_cross_entropy(logits, BATCH) for logits in (*out.pass_logits, out.logits)]
    assert len(set(per_pass)) == 3
    sums = model.loss(out, BATCH)
    loss, tokens = (float(a) for a in sums["loss"])
    assert tokens == float(BATCH["loss_mask"][:, : ROW // 2].sum())
    want = np.mean(per_pass) if supervise == "all" else per_pass[-1]
    # the loss by another formula (numpy's log-softmax and mean over the row's tokens): a few fp32 roundings
    assert loss / tokens == pytest.approx(want, rel=1e-5)
    assert float(sums["loss_last_pass"][0]) / tokens == pytest.approx(per_pass[-1], rel=1e-5)


def test_a_training_row_holds_seq_len_over_k_plus_one_vocabulary_tokens(stub):
    """The expanded length is fixed: at each K a row of data.seq_len slots runs its first seq_len / (K + 1)
    vocabulary tokens (and their layout), N (K + 1) = seq_len slots; a K whose interval does not divide the
    row is one clear error."""
    model = _built(thoughts=(0, 1, 2))
    for k in (0, 1, 2):
        out = _apply(model, draw=lrt.Draw(k, 2))
        call, n = stub.calls[-1], ROW // (k + 1)
        assert call["thoughts"] == k and call["tokens"].shape == (2, n) and out.logits.shape[:2] == (2, n)
        np.testing.assert_array_equal(call["tokens"], BATCH["tokens"][:, :n])
        for name, a in call["layout"]._asdict().items():
            np.testing.assert_array_equal(a, BATCH[name][:, :n])
        assert thought_slots.expand(call["tokens"], call["layout"], k).tokens.shape == (2, ROW)
    cut = thought_slots.vocabulary_prefix(BATCH, 8)
    assert cut["length"] is BATCH["length"]  # [B] entries are kept
    assert {name for name, a in cut.items() if a.shape[1:2] == (8,)} == set(BATCH) - {"length"}
    with pytest.raises(ValueError, match="a training row: a row of 24 slots does not split into whole"):
        _apply(model, draw=lrt.Draw(4, 1))


@pytest.mark.numerics
def test_the_ponderlm2_builder_fixes_its_settings(stub):
    """arch=ponderlm2: thought slots with no feedback (no LRT parameters, no cross-token memory), the loss
    at the last pass, P drawn from ponderlm2.passes (the paper's distribution by default), K from
    ponderlm2.thoughts, exact evaluation at the largest K; ponderlm2.embed_scale scales the vocabulary
    embeddings by sqrt(2.5 H) in training and decoding alike."""
    model = _built("ponderlm2", thoughts=(2,))
    assert model.name == "ponderlm2" and "lrt" not in model.specs
    assert ARCHITECTURES.get("ponderlm2").capabilities.thought_slots
    shapes = lambda specs: jax.tree.map(lambda spec: spec.shape, specs, is_leaf=lambda x: hasattr(x, "shape"))
    assert shapes(model.specs) == shapes(_built("transformer").specs)  # the plain backbone's, nothing more
    _apply(model, draw=model.sample(0, 1))
    fixed = lrt_forward.LRTConfig(model.backbone, feedback="none", thought_slots=True, cross_token=False)
    assert stub.calls[-1]["cfg"] == fixed and stub.calls[-1]["thoughts"] == 2
    draws = {model.sample(0, step) for step in range(1, 200)}
    assert draws == {lrt.Draw(2, p) for p in lrt.PASSES}
    assert model.train_flops(ROW) == pytest.approx(sum(  # P's probabilities, the head at the last pass only
        w * lrt.train_flops(fixed, ROW, lrt.Draw(2, p), False) for p, w in zip(lrt.PASSES, lrt.PASS_PROBS)
    ))  # fmt: skip
    _apply(model)  # evaluation: the exact recurrence at the largest K
    assert (stub.calls[-1]["run"], stub.calls[-1]["thoughts"]) == ("exact", 2)
    release = _built("ponderlm2", thoughts=(1, 2), passes=(3, 4), pass_probs=(0.5, 0.5))
    assert {release.sample(0, step) for step in range(1, 100)} == {
        lrt.Draw(k, p) for k in (1, 2) for p in (3, 4)
    }

    scaled = _built("ponderlm2", thoughts=(1,), embed_scale=True)
    scale = math.sqrt(2.5 * scaled.backbone.hidden_size)
    _apply(scaled, draw=lrt.Draw(1, 1))
    assert stub.calls[-1]["cfg"] == dataclasses.replace(fixed, embed_scale=scale)
    _apply(scaled)
    assert stub.calls[-1]["cfg"].embed_scale == scale  # decoding too
    scaled_cfg = dataclasses.replace(PONDER, embed_scale=scale)
    assert_fp32_close(  # an embedding and its scale: one op
        lrt_forward.vocab_inputs(scaled_cfg, PARAMS, TOKS4), backbone.embed(NANO, PARAMS, TOKS4) * scale, 1
    )

    row = load_config("lrt_comparison", "ponder2,cpu")  # Table 1's PonderLM-2 row, resolved
    built = build_architecture(resolve(row))
    assert row.arch == "ponderlm2" and row.data.seq_len == 3 * row.eval.window
    assert {built.sample(row.seed, step) for step in range(1, 100)} == {lrt.Draw(2, 1), lrt.Draw(2, 2)}


@pytest.mark.parametrize(
    "row,feedback,cross_token,thoughts",
    [
        ("no_cross", "both", False, {0, 1}),
        ("no_kv", "residual", True, {0, 1}),
        ("fixed_k1", "both", True, {1}),
    ],
)
def test_the_table3_ablation_rows_build_what_they_name(stub, row, feedback, cross_token, thoughts):
    """configs/lrt_comparison.py's Table 3 rows, resolved and built: the one-thought-token LRT without
    cross-token recurrence / without KV feedback / trained at K = 1 only, each evaluated at K = 1 on rows
    of the reference length, trained on rows of twice it."""
    config = load_config("lrt_comparison", f"{row},cpu")
    model = build_architecture(resolve(config))
    assert config.arch == "lrt" and config.data.seq_len == 2 * config.eval.window
    draws = {model.sample(config.seed, step) for step in range(1, 100)}
    assert {d.thoughts for d in draws} == thoughts
    batch = {name: jnp.asarray(a) for name, a in tiny_batch(0, 1, 1, config.data.seq_len).items()}
    _apply(model, batch, draw=lrt.Draw(1, 1))
    cfg = stub.calls[-1]["cfg"]
    assert (cfg.feedback, cfg.cross_token, cfg.thought_slots) == (feedback, cross_token, True)
    assert ("gate_thought" in model.specs["lrt"]) == (feedback == "both")
    assert "gamma_thought" in model.specs["lrt"]
    # the spec's "scales separate for vocabulary vs thought positions": the resid / x0 scalars too, each
    # specified (init, optimizer role) as the backbone's own
    for name in lrt_forward.THOUGHT_SCALARS:
        assert model.specs["lrt"][name + "_thought"] == model.specs[name]
    _apply(model, {name: a[:, : config.eval.window] for name, a in batch.items() if a.ndim == 2})
    assert (stub.calls[-1]["run"], stub.calls[-1]["thoughts"]) == ("exact", 1)
