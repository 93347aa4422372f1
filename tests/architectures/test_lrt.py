"""The LRT: sequential decoding == the exact recurrence == P >= T parallel refinement passes (fp32 round-off:
the float64 rule of tests/tolerance.py against the naive recurrence of tests/reference.py, the path T slots
of NANO's layers deep); feedback off == the plain backbone (the depth rule); the pass count P drawn per
step; every bad setting one clear error."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from t2mlr_jax.architectures import build_architecture
from t2mlr_jax.architectures.contract import Outputs
from t2mlr_jax.architectures.lrt import architecture as lrt
from t2mlr_jax.architectures.lrt import forward as lrt_forward
from t2mlr_jax.experiment import resolve
from t2mlr_jax.model import backbone
from t2mlr_jax.model import generate as generation
from t2mlr_jax.model.spec import init_from_specs
from t2mlr_jax.model.token_layout import make_layout
from tests import reference
from tests.tiny import NANO, tiny_experiment
from tests.tolerance import assert_fp32_close, assert_near_f64

B, T = 2, 7
CFG = lrt_forward.LRTConfig(NANO)
TOKS = jax.random.randint(jax.random.PRNGKey(1), (B, T), 1, NANO.vocab_size)
# Two documents in row 1 (the memory must reset at the second one's start).
LAYOUT = make_layout(
    TOKS,
    positions=jnp.asarray([list(range(T)), [0, 1, 2, 0, 1, 2, 3]]),
    segment_ids=jnp.asarray([[1] * T, [1, 1, 1, 2, 2, 2, 2]]),
)


def _params(cfg, seed=0):
    """Random weights everywhere (nanochat's zero inits would hide paths): the gates and the feedback
    projections all matter."""
    params = init_from_specs(lrt_forward.lrt_specs(cfg), jax.random.PRNGKey(seed), "float32")
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(seed + 1), len(leaves))
    return jax.tree.unflatten(tree, [x + 0.3 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])


PARAMS = _params(CFG)
STATE = {"router_bias": 0.1 * jax.random.normal(jax.random.PRNGKey(5), (NANO.num_layers, NANO.moe_experts))}
refine = jax.jit(lrt_forward.refine, static_argnums=(0, 4))
exact = jax.jit(
    lambda cfg, p, t, layout, s: lrt_forward.exact_forward(cfg, p, t, layout, mlp_state=s), static_argnums=0
)


def _truth(layout):
    """The float64 logits of the naive recurrence (tests/reference.py) on TOKS."""
    return reference.lrt(CFG, reference.f64(PARAMS), TOKS, layout, mlp_state=reference.f64(STATE))


@pytest.mark.numerics
def test_exact_recurrence_equals_enough_refinement_passes():
    want, truth = exact(CFG, PARAMS, TOKS, LAYOUT, STATE).logits, _truth(LAYOUT)
    passes = refine(CFG, PARAMS, TOKS, LAYOUT, T - 1, STATE).logits  # pass 0 + T - 1 refinements
    assert len(passes) == T
    assert_near_f64(passes[-1], want, truth, T * NANO.num_layers, "T passes")  # the memory through T tokens
    # After p passes (pass 0 + p - 1 refinements) the first p positions are exact and a later one is not yet.
    p = 2
    assert_near_f64(passes[p - 1][0, :p], want[0, :p], truth[0, :p], p * NANO.num_layers, "p passes")
    assert np.abs(passes[p - 1][0, p:] - want[0, p:]).max() > 1e-3


@pytest.mark.numerics
def test_decoding_step_by_step_equals_the_exact_recurrence():
    """Prefill + cached steps give the exact recurrence's logits (fp32 round-off), and generation's loop
    over them makes its greedy choices."""
    decoder = lrt_forward.LRTDecoder(CFG)
    decoded = generation.teacher_forced(decoder, (PARAMS, {"mlp": STATE}), TOKS, 3)
    want = exact(CFG, PARAMS, TOKS, make_layout(TOKS), STATE).logits  # generation: one document per row
    assert_near_f64(decoded, want, _truth(make_layout(TOKS)), T * NANO.num_layers, "decoded")
    prompt, n = TOKS[:, :3], 4
    out = generation.generate_with(
        decoder, (PARAMS, {"mlp": STATE}), prompt, jnp.ones_like(prompt), max_new_tokens=n
    )
    full = jnp.concatenate([prompt, out.tokens[:, :-1]], axis=1)
    logits = exact(CFG, PARAMS, full, make_layout(full), STATE).logits
    np.testing.assert_array_equal(jnp.argmax(logits[:, 2:], axis=-1), out.tokens)


def test_the_loss_averages_pass_0_and_the_p_refinements_or_reads_the_last():
    """The plain LRT supervises pass 0 and each of its P refinement passes (1 + P in all, as the paper
    and the release count), averaged equally; supervise="last" reads the last pass only."""
    logits = refine(CFG, PARAMS, TOKS, LAYOUT, 2, STATE).logits
    assert len(logits) == 3
    targets = jnp.roll(TOKS, -1, axis=1)
    batch = dict(tokens=TOKS, targets=targets, loss_mask=jnp.ones_like(TOKS), positions=LAYOUT.positions,
                 segment_ids=LAYOUT.segment_ids, control_flow=LAYOUT.control_flow)  # fmt: skip
    outputs = Outputs(logits[-1], pass_logits=logits[:-1])
    ce = [float(optax.softmax_cross_entropy_with_integer_labels(x, targets).mean()) for x in logits]
    for supervise, want in (("all", np.mean(ce)), ("last", ce[-1])):
        total, count = lrt.multi_pass_loss(supervise)(outputs, batch)["loss"]
        # the loss by another formula (a sum over the 2 x 7 tokens, then a mean): a few fp32 roundings
        np.testing.assert_allclose(float(total / count), want, rtol=1e-5)
    assert len({round(x, 4) for x in ce}) == 3  # the passes differ: the average is not the last pass


@pytest.mark.slow
@pytest.mark.numerics
@pytest.mark.parametrize("shared", [False, True], ids=["per_layer", "shared"])
def test_silent_feedback_is_the_plain_backbone(shared):
    """feedback=none is the backbone; so is feedback=both with gamma = 0, W^fb = 0 and the gates at 1."""
    cfg = dataclasses.replace(CFG, shared_projections=shared)
    params = _params(cfg)
    plain = backbone.forward(NANO, params, TOKS, positions=LAYOUT.positions, segment_ids=LAYOUT.segment_ids,
                             mlp_state=STATE)  # fmt: skip
    none = dataclasses.replace(cfg, feedback="none")
    depth = NANO.num_layers  # silent feedback adds exact zeros: no path through the memory
    assert_fp32_close(refine(none, params, TOKS, LAYOUT, 0, STATE).logits[-1], plain, depth, "none")
    params["lrt"] = jax.tree.map(jnp.zeros_like, params["lrt"])
    assert_fp32_close(refine(cfg, params, TOKS, LAYOUT, 3, STATE).logits[-1], plain, depth, "refined")
    assert_fp32_close(exact(cfg, params, TOKS, LAYOUT, STATE).logits, plain, depth, "exact")


def test_feedback_starts_at_gamma_0_1_with_the_gates_at_1():
    fresh = init_from_specs(lrt_forward.lrt_specs(CFG), jax.random.PRNGKey(0), "float32")["lrt"]
    np.testing.assert_array_equal(fresh["gamma"], np.full(NANO.num_layers, 0.1, np.float32))
    np.testing.assert_array_equal(fresh["gate"], 0.0)  # 2 sigmoid(0) = 1: local and feedback at full weight
    assert float(jnp.abs(fresh["k_fb"]).max()) > 0  # the projections start random, like v_proj


def test_shared_projections_are_a_small_fraction():
    from t2mlr_jax.model.spec import count_specs

    per_layer, shared = (
        count_specs(lrt_forward.lrt_specs(dataclasses.replace(CFG, shared_projections=s))["lrt"])
        for s in (False, True)
    )
    assert shared < per_layer / 2
    assert count_specs(lrt_forward.lrt_specs(dataclasses.replace(CFG, feedback="none"))) < count_specs(
        lrt_forward.lrt_specs(CFG)
    )


def _config(**lrt_settings):
    config = tiny_experiment("lrt", steps=4)
    for key, value in lrt_settings.items():
        config.lrt[key] = value
    return config


@pytest.mark.slow
def test_pass_count_is_drawn_per_step_from_seed_and_step():
    arch = build_architecture(resolve(_config()), "lrt")
    draws = [arch.sample(0, step) for step in range(1, 2001)]
    assert draws == [arch.sample(0, step) for step in range(1, 2001)]
    freq = np.bincount([d.passes for d in draws], minlength=5)[1:] / len(draws)
    np.testing.assert_allclose(freq, (0.4, 0.3, 0.2, 0.1), atol=0.04)  # 2000 draws: sd <= 0.011
    assert {d.thoughts for d in draws} == {0}
    config = _config(thoughts=(0, 1, 2))
    config.data.seq_len = 12  # whole intervals of 1, 2 and 3 slots
    thoughts = [build_architecture(resolve(config), "lrt").sample(0, s).thoughts for s in range(900)]
    np.testing.assert_allclose(np.bincount(thoughts) / 900, (1 / 3,) * 3, atol=0.05)  # K uniform (sd 0.016)
    assert build_architecture(resolve(_config(feedback="none")), "lrt").sample is None  # one plain pass


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(feedback="memory"), "lrt.feedback must be one of"),
        (dict(pass_probs=(0.5, 0.3, 0.1, 0.05)), "lrt.pass_probs must be 4 probabilities"),
        (dict(passes=(1, 2), pass_probs=(1.0,)), "lrt.pass_probs must be 2 probabilities"),
        (dict(passes=(0, 2), pass_probs=(0.5, 0.5)), "lrt.passes must be distinct"),
        (dict(supervise="first"), "lrt.supervise must be one of"),
        (dict(cross_token=False), r"lrt.cross_token=False cuts the only memory .* \(lrt.thoughts=\(0,\)\)"),
    ],
)
def test_bad_lrt_settings_are_one_clear_error(change, message):
    with pytest.raises(ValueError, match=message):
        build_architecture(resolve(_config(**change)), "lrt")


def test_bad_moe_settings_are_one_clear_error():
    config = _config()
    config.model.mlp, config.model.moe_experts, config.model.moe_top_k = "moe", 4, 5
    with pytest.raises(ValueError, match=r"moe_top_k \(5\) must be in \[1, moe_experts=4\]"):
        build_architecture(resolve(config), "lrt")
    config.arch = "transformer"
    config.model.moe_top_k = 2
    with pytest.raises(ValueError, match="keeps routing state"):
        build_architecture(resolve(config), "transformer")


def test_experts_not_divisible_by_the_expert_axis_fail_before_compiling(tmp_path):
    from t2mlr_jax.train.trainer import Run
    from tests.tiny import tiny_lrt_experiment
    from tests.train.tiny_task import tiny_source

    config = tiny_lrt_experiment()
    config.model.moe_experts = 6
    config.mesh.data, config.mesh.expert = 2, 4
    with pytest.raises(ValueError, match=r"moe_experts \(6\) is not divisible by .* mesh.expert = 4"):
        Run(resolve(config), tmp_path, tiny_source(), "lrt")
    assert not any(tmp_path.iterdir())  # nothing written


def test_the_config_presets_are_the_papers_sizes_and_the_vanilla_baseline():
    from tests.train.test_build_data import load_config

    sizes = {}
    for preset in ("", "d20", "vanilla", "cpu", "vanilla,cpu"):
        config = load_config("lrt_nanochat", preset)
        arch = build_architecture(resolve(config), "lrt")
        sizes[preset] = arch.num_params()
        assert config.optimizer.name == "muon" and arch.backbone.mlp == "moe"
    assert abs(sizes["vanilla"] - 0.805e9) < 0.01e9  # the paper's 0.8B 16-layer reference
    assert 0.03 < sizes[""] / sizes["vanilla"] - 1 < 0.06  # per-layer feedback projections: ~5%
    assert 1.42e9 < sizes["d20"] < 1.55e9
    config = load_config("lrt_nanochat", "")
    config.lrt.shared_projections = True  # one W^fb pair for every layer: ~0.3%
    assert 0.002 < build_architecture(resolve(config), "lrt").num_params() / sizes["vanilla"] - 1 < 0.004
    o = config.optimizer
    recipe = (o.name, o.lr, o.muon.b1, o.muon.b2, o.muon.weight_decay, o.schedule, o.linear_decay.decay_ratio)
    assert recipe == ("muon", 1.0, 0.8, 0.95, 0.2, "linear_decay", 0.5)
    assert sizes["vanilla,cpu"] < sizes["cpu"] < 40e6
    config = load_config("lrt_nanochat", "cpu")
    config.lrt.feedback = "kv"  # --config.lrt.feedback=kv: an ablation without the residual path
    assert "gamma" not in build_architecture(resolve(config), "lrt").specs["lrt"]
