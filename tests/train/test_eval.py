import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2mlr_jax.experiment import resolve
from t2mlr_jax.train.eval import evaluate, left_pad


def _batch():
    """Two S5-like rows: a copied prefix (control flow 1) then answers (2); row 0 answers right."""
    targets = np.asarray([[5, 6, 7, 8], [5, 6, 9, 9]], np.int32)
    return {
        "tokens": targets.copy(),
        "targets": targets,
        "loss_mask": np.ones((2, 4), np.float32),
        "positions": np.tile(np.arange(4, dtype=np.int32), (2, 1)),
        "segment_ids": np.ones((2, 4), np.int32),
        "control_flow": np.asarray([[1, 1, 2, 2], [1, 1, 2, 2]], np.int32),
        "length": np.asarray([1, 2], np.int32),
    }


def fake_step(params, model_state, batch):
    predictions = batch["targets"].copy()
    predictions[1, 3] = 0  # one wrong answer token in row 1
    return {
        "loss_sum": np.asarray([0.5, 1.5]),
        "tokens": np.asarray([4.0, 4.0]),
        "correct": None,
        "predictions": predictions,
    }


def test_scores_on_answers_only_and_per_length_bin():
    answers = evaluate(fake_step, {}, {}, [_batch()], score="recurrent")
    assert answers["loss"] == pytest.approx(2.0 / 8) and answers["examples"] == 2
    assert answers["token_accuracy"] == pytest.approx(3 / 4) and answers["exact_match"] == pytest.approx(0.5)
    assert answers["by_length"][1]["exact_match"] == 1.0 and answers["by_length"][2]["exact_match"] == 0.0
    everything = evaluate(fake_step, {}, {}, [_batch()], score="loss_mask")
    assert everything["token_accuracy"] == pytest.approx(7 / 8)
    with pytest.raises(ValueError, match="eval.score"):
        evaluate(fake_step, {}, {}, [_batch()], score="all")


def test_bits_per_byte_is_reported_only_when_batches_carry_target_bytes():
    def step_with_bytes(params, model_state, batch):
        assert batch["target_bytes"].shape == (2, 4)  # model_inputs passes the optional key on
        return {**fake_step(params, model_state, batch), "bytes": np.asarray([3.0, 5.0])}

    batch = {**_batch(), "target_bytes": np.full((2, 4), 1, np.int32)}
    metrics = evaluate(step_with_bytes, {}, {}, [batch, batch])
    assert metrics["bpb"] == pytest.approx(2 * 2.0 / (np.log(2) * 16))
    assert metrics["loss"] == pytest.approx(2.0 / 8)
    assert "bpb" not in evaluate(fake_step, {}, {}, [_batch()])


def test_the_default_loss_and_row_stats_count_bits_per_target_byte():
    from t2mlr_jax.architectures.contract import Outputs, next_token_loss, row_stats

    batch = _batch()
    batch["loss_mask"][1, 3] = 0.0
    batch["target_bytes"] = np.asarray([[1, 2, 0, 4], [3, 3, 3, 0]], np.int32)  # 0: a special, or no loss
    logits = jnp.asarray(np.random.default_rng(0).normal(size=(2, 4, 10)), jnp.float32)
    rows = row_stats(logits, batch)
    np.testing.assert_allclose(rows["bytes"], [7.0, 9.0])
    sums = next_token_loss(Outputs(logits, aux_losses={"z": jnp.float32(1.0)}), batch)
    nll_bits, total_bytes = sums["bpb"]
    assert float(total_bytes) == 16.0
    # no aux; the same 8 fp32 terms in two orders: within 2 * 7u = 8.3e-7 relative (γ_{n-1}, terms >= 0)
    assert float(nll_bits) == pytest.approx(float(rows["loss_sum"].sum()) / np.log(2), rel=1e-6)
    del batch["target_bytes"]
    assert "bytes" not in row_stats(logits, batch) and "bpb" not in next_token_loss(Outputs(logits), batch)


def test_nanochat_bpb_masking_leaves_zero_byte_targets_out_of_the_numerator():
    """One hand-made row, bits worked out by hand: target 0 uniform over 4 (2 bits, 3 bytes), target 1 a
    special token (p = 3/(3+1+1+1) = 1/2: 1 bit, 0 bytes), target 2 uniform (2 bits, 1 byte), target 3
    unsupervised. loss_mask: (2 + 1 + 2) / 4 bytes = 1.25 bpb; nanochat: (2 + 2) / 4 = 1.0."""
    from t2mlr_jax.architectures.contract import row_stats
    from tests.tiny import tiny_experiment

    logits = jnp.zeros((1, 4, 4), jnp.float32).at[0, 1, 0].set(np.log(3.0))
    batch = {
        **jax.tree.map(lambda a: a[:1], _batch()),
        "targets": np.zeros((1, 4), np.int32),
        "loss_mask": np.asarray([[1, 1, 1, 0]], np.float32),
        "target_bytes": np.asarray([[3, 0, 1, 0]], np.int32),
    }
    step = lambda params, model_state, batch: {
        **row_stats(logits, batch),
        "predictions": np.zeros((1, 4), np.int32),
    }
    bpb = lambda masking: evaluate(step, {}, {}, [batch], bpb_masking=masking)["bpb"]
    # fp32 sums of a few terms against their exact value: within a few u = 2^-24 relative
    assert bpb("loss_mask") == pytest.approx(1.25, rel=1e-6)
    assert bpb("nanochat") == pytest.approx(1.0, rel=1e-6)
    with pytest.raises(ValueError, match="eval.bpb_masking"):
        bpb("special")
    config = tiny_experiment("transformer")
    config.eval.bpb_masking = "special"
    with pytest.raises(ValueError, match="eval.bpb_masking"):
        resolve(config)


def test_train_and_eval_steps_log_bits_per_byte(tmp_path):
    """Through model_inputs, the jitted train step (2 micro-batches) and the eval step; every architecture
    shares the default loss, so the tiny transformer stands for all."""
    import jax

    from t2mlr_jax.train.eval import make_eval_step
    from t2mlr_jax.train.train_step import compile_step, init_state, model_inputs
    from t2mlr_jax.train.trainer import Run
    from tests.tiny import tiny_experiment
    from tests.train.tiny_task import tiny_batch, tiny_source

    run = Run(resolve(tiny_experiment("transformer")), tmp_path, tiny_source(), "transformer")
    batch = tiny_batch(0, 1, 8, 16)
    target_bytes = np.random.default_rng(1).integers(1, 5, size=batch["targets"].shape)
    batch["target_bytes"] = (target_bytes * batch["loss_mask"]).astype(np.int32)
    inputs = model_inputs(batch)
    assert "target_bytes" in inputs and "length" not in inputs
    state = init_state(run.arch, run.optimizer, 0)
    eval_metrics = evaluate(make_eval_step(run.arch), state.params, state.model_state, [batch])
    _, metrics = compile_step(run.arch, run.optimizer, run.schedule, 2)(state, inputs)
    metrics = jax.device_get(metrics)
    expected = float(metrics["loss"]) * float(metrics["tokens"]) / (np.log(2) * batch["target_bytes"].sum())
    # bpb is the summed loss over the summed bytes: the same fp32 sums over the 128 tokens in other orders
    # (within 2 * 127u = 1.5e-5 relative, γ_{n-1}, the terms >= 0) ...
    assert float(metrics["bpb"]) == pytest.approx(expected, rel=1.5e-5)
    # ... and the eval step's, the same per-token losses (a model at init: the forward's round-off is a few u
    # of a loss near ln(vocab), far below the sums')
    assert float(metrics["bpb"]) == pytest.approx(eval_metrics["bpb"], rel=1.5e-5)


def test_left_pad_aligns_prompts_to_the_right():
    tokens, mask = left_pad([np.asarray([1, 2]), np.asarray([3, 4, 5])], pad_id=0)
    np.testing.assert_array_equal(tokens, [[0, 1, 2], [3, 4, 5]])
    np.testing.assert_array_equal(mask, [[0, 1, 1], [1, 1, 1]])


def test_generation_eval_batches_left_padded_prompts_strips_eos_and_bins():
    from t2mlr_jax.architectures import Architecture
    from t2mlr_jax.model.generate import GenerateOutput
    from t2mlr_jax.train.eval import evaluate_generation

    def echo_last_two(params, model_state, prompt, mask, control_flow, max_new_tokens, eos_id, pad_id):
        """A stand-in model: 'generates' the last two prompt tokens, then EOS."""
        out = jnp.concatenate([prompt[:, -2:], jnp.full((len(prompt), 1), eos_id)], axis=1)
        assert control_flow is not None
        return GenerateOutput(
            out, jnp.full(len(prompt), 3) - jnp.sum(control_flow * (1 - mask))
        )  # pads: flow 0

    arch = Architecture("fake", {}, "float32", lambda *a, **k: None, echo_last_two)
    examples = [
        {"prompt": np.asarray(p), "prompt_control_flow": np.ones(len(p), np.int32), "answer": a, "length": n}
        for p, a, n in (([5, 6], "5 6", 1), ([7, 8, 9], "8 9", 2), ([4, 4, 4, 4], "0 0", 2))
    ]
    metrics, records = evaluate_generation(
        arch,
        {},
        {},
        examples,
        decode=lambda ids: " ".join(map(str, ids)),
        score=lambda t, e: t == e["answer"],
        max_new_tokens=3,
        eos_id=1,
        pad_id=0,
        batch_size=2,
    )
    assert [r["prediction"] for r in records] == ["5 6", "8 9", "4 4"]
    assert metrics["generation_exact_match"] == pytest.approx(2 / 3) and metrics["examples"] == 3
    assert metrics["generation_by_length"] == {
        1: {"exact_match": 1.0, "examples": 1},
        2: {"exact_match": 0.5, "examples": 2},
    }


@pytest.mark.slow
def test_generation_eval_samples_with_a_fixed_seed_and_top_k_one_is_greedy():
    """eval.temperature > 0 samples (the release's HotpotQA evaluation: temperature 1, top-k 50) through
    the architecture's cached generate: one seed draws the same tokens on every run, another seed others;
    top-k 1 keeps only the argmax, which is greedy decoding."""
    from t2mlr_jax.architectures import Architecture
    from t2mlr_jax.architectures.contract import CachedGenerate
    from t2mlr_jax.architectures.recompute import recompute_architecture
    from t2mlr_jax.architectures.t2mlr import T2MLRDecoder
    from t2mlr_jax.model.generate import Sampling
    from t2mlr_jax.train.eval import evaluate_generation
    from tests.tiny import tiny_config, tiny_params, tokens

    cfg = tiny_config()
    params = tiny_params(cfg, gamma=0.8)
    decoding = CachedGenerate(lambda p, _: (T2MLRDecoder(cfg), p))
    arch = Architecture("t2mlr", {}, "float32", lambda *a, **k: None, decoding)
    examples = [{"prompt": np.asarray(tokens(1, n, seed=n)[0])} for n in (3, 4, 5, 6)]

    def predictions(model=arch, **sampling):
        _, records = evaluate_generation(
            model, params, {}, examples, decode=lambda ids: " ".join(map(str, ids)), score=lambda t, e: True,
            max_new_tokens=8, eos_id=None, pad_id=0, batch_size=2, **sampling,
        )  # fmt: skip
        return [r["prediction"] for r in records]

    greedy, release = predictions(), Sampling(temperature=1.0, top_k=50)
    assert predictions(sampling=Sampling(temperature=1.0, top_k=1)) == greedy
    drawn = predictions(sampling=release, seed=42)
    assert drawn == predictions(sampling=release, seed=42)
    assert drawn != predictions(sampling=release, seed=43) and drawn != greedy
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\]"):
        predictions(sampling=Sampling(temperature=1.0, top_p=0.0))
    greedy_only = recompute_architecture("pause", {}, "float32", lambda p, t, layout: None)
    with pytest.raises(ValueError, match="pause generates greedily only"):
        predictions(greedy_only, sampling=release)
