"""Expected training FLOPs (t2mlr_jax.model.flops, Appendix C.1): the formula by hand on a toy model, MoE
counting active experts, each architecture's accounting, train.flop_budget, and configs/lrt_comparison.py's
rows at the paper's sizes (Table 1's parameter ratios)."""

import jax
import jax.numpy as jnp
import pytest

from t2mlr_jax.architectures import build_architecture
from t2mlr_jax.architectures.lrt import architecture as lrt
from t2mlr_jax.architectures.lrt import forward as lrt_forward
from t2mlr_jax.architectures.t2mlr import flops as t2mlr_flops
from t2mlr_jax.architectures.t2mlr.fusion import mixer_specs
from t2mlr_jax.experiment import for_arch, resolve
from t2mlr_jax.model import flops
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.studies.benchmarks.flops import expected_train_flops, jaxpr_matmul_flops
from tests.tiny import tiny_experiment
from tests.train.test_build_data import load_config
from tests.train.tiny_task import tiny_source

TOY = ModelConfig(
    vocab_size=50, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=2, head_dim=16, mlp_dim=64
)


def test_a_pass_by_hand():
    block = 4 * 32 * 32 + 3 * 32 * 64  # q, k, v, o + SwiGLU's three matrices
    attention = 4 * 4 * 2.5 * 2 * 16  # 4 queries see 2.5 keys on average, 2 heads of 16
    assert flops.block_params(TOY) == block
    assert flops.pass_flops(TOY, 4) == 2 * (2 * 4 * block + attention)
    assert flops.head_flops(TOY, 3) == 2 * 3 * 32 * 50
    windowed = TOY.replace(window_pattern="SL", sliding_window=1)  # layer 0 sees <= 2 keys
    assert flops.pass_flops(windowed, 4) == flops.pass_flops(TOY, 4) - 4 * 4 * (2.5 - 1.75) * 2 * 16


def test_jaxpr_counts_a_ragged_dot_as_its_grouped_matmul():
    """A ragged_dot (the dropless MoE's grouped matmul: [m, k] rows against [groups, k, n]) is 2 m k n, not
    2 m k n x groups; so is each of its gradients (the input's against the groups transposed, the weights'
    a contraction over the ragged rows)."""
    x, w, sizes = jnp.ones((10, 4)), jnp.ones((3, 4, 5)), jnp.array([2, 3, 5], jnp.int32)
    f = lambda x, w: jnp.sum(jax.lax.ragged_dot(x, w, sizes))
    assert jaxpr_matmul_flops(jax.make_jaxpr(f)(x, w).jaxpr) == 2 * 10 * 4 * 5
    assert jaxpr_matmul_flops(jax.make_jaxpr(jax.grad(f, argnums=(0, 1)))(x, w).jaxpr) == 3 * 2 * 10 * 4 * 5


def test_moe_counts_the_active_experts_only():
    moe = TOY.replace(mlp="moe", moe_experts=8, moe_top_k=2, moe_shared=1, moe_dim=24)
    routed = 2 * (2 * 32 * 24)  # two of the eight relu² experts
    assert flops.block_params(moe) == 4 * 32 * 32 + 32 * 8 + routed + 2 * 32 * 24


PATHWAY = {"source": 2, "destination": 0, "parallel_max_passes": 3}  # recirculation: blocks 1..2, 3 passes


def _arch(arch="lrt", seq_len=12, **lrt_settings):
    config = tiny_experiment(arch)
    config.data.seq_len, config.baseline.param_match = seq_len, False
    for key, value in lrt_settings.items():
        config.lrt[key] = value
    return build_architecture(resolve(config), arch)


def test_each_architecture_accounts_for_what_it_runs():
    plain = _arch("transformer").train_flops(12)
    assert _arch(feedback="none").train_flops(12) == pytest.approx(plain)  # the same single pass
    looped = _arch("looped")  # the stack twice, the head once
    model = looped.backbone
    assert looped.train_flops(12) == pytest.approx(
        plain + 3 * flops.pass_flops(model, 12), rel=1e-9
    )  # fmt: skip
    one = _arch(passes=(1,), pass_probs=(1.0,))
    two = _arch(passes=(2,), pass_probs=(1.0,))
    both = _arch()  # P ~ (0.4, 0.3, 0.2, 0.1): E[P] = 2, and FLOPs are linear in P
    assert one.train_flops(12) > plain
    assert both.train_flops(12) == pytest.approx(two.train_flops(12))
    thought = _arch(thoughts=(1,), passes=(2,), pass_probs=(1.0,))
    cfg = lrt_forward.LRTConfig(thought.backbone, thought_slots=True)
    assert thought.train_flops(12) == pytest.approx(lrt.train_flops(cfg, 12, lrt.Draw(1, 2), True))


def test_a_thought_row_by_hand():
    """One training row of 12 slots on the tiny backbone (3 blocks, D 32, 2 heads of 16, SwiGLU 64, V 16,
    gate channels 32), by hand: pass 0 over the N = 12 / (K + 1) vocabulary tokens, P refinement passes
    over the 12 slots, the head at the N last slots of every refinement pass (supervise "all") or of the
    last one; forward + backward = 3 forwards. PonderLM-2 alike without feedback, the head once."""
    block = 4 * 32 * 32 + 3 * 32 * 64  # q, k, v, o + SwiGLU's three matrices
    feedback = 2 * 32 * 2 * 16  # W_k^fb, W_v^fb: D -> 2 kv heads of 16
    gate = 32 * 2 * 2  # W_g: 32 channels -> (local, feedback) x 2 kv heads; thought slots have their own

    def forward(length, extra):  # one pass: 3 blocks, causal attention (query i scores i + 1 keys)
        return 3 * (2 * length * (block + extra) + 4 * length * (length + 1) / 2 * 2 * 16)

    def head(positions):
        return 2 * positions * 32 * 16

    def row(k, p, supervise_all=True):
        n = 12 // (k + 1)
        pass0 = forward(n, feedback + gate)  # pass 0 runs the vocabulary gate only
        return 3 * (pass0 + p * forward(12, feedback + 2 * gate) + head((p if supervise_all else 1) * n))

    thought = _arch(thoughts=(1,), passes=(2,), pass_probs=(1.0,))
    assert flops.block_params(thought.backbone) == block and thought.backbone.gate_channels == 32
    assert thought.train_flops(12) == pytest.approx(row(1, 2), rel=1e-12)
    last = _arch(thoughts=(2,), passes=(3,), pass_probs=(1.0,), supervise="last")
    assert last.train_flops(12) == pytest.approx(row(2, 3, supervise_all=False), rel=1e-12)
    sampled = _arch(thoughts=(0, 1), passes=(1, 2), pass_probs=(0.25, 0.75))  # K uniform, P as given
    want = sum(0.5 * w * row(k, p) for k in (0, 1) for p, w in ((1, 0.25), (2, 0.75)))
    assert sampled.train_flops(12) == pytest.approx(want, rel=1e-12)
    config = tiny_experiment("ponderlm2")
    config.data.seq_len, config.baseline.param_match = 12, False
    config.ponderlm2.thoughts, config.ponderlm2.passes, config.ponderlm2.pass_probs = (2,), (3,), (1.0,)
    ponder = build_architecture(resolve(config), "ponderlm2")
    assert ponder.train_flops(12) == pytest.approx(
        3 * (forward(4, 0) + 3 * forward(12, 0) + head(4)), rel=1e-12
    )


def _t2mlr(**settings):
    """The tiny T²MLR (3 blocks, the middle block 1 alone, D 4, B 2) at rows of 12, with fields of
    config.t2mlr or config.model.recurrence changed."""
    config = tiny_experiment("t2mlr")
    config.data.seq_len = 12
    for key, value in settings.items():
        section = config.model.recurrence if key in config.model.recurrence else config.t2mlr
        section[key] = value
    return build_architecture(resolve(config), "t2mlr")


def test_a_t2mlr_row_by_hand():
    """Jacobi at D 4, B 2 (the spec's loop): blocks 0..1 unfused, 3 refinements of block 1 behind the fusion,
    then the fusion, blocks 1..2 and the head; the gradient through the blocks below, the final pass and
    the last 2 refinements. The fusion: W_rec (D x D) and the two gates ([x; r], 2D -> D)."""
    arch = _t2mlr()
    model = arch.backbone
    assert flops.matrix_params(mixer_specs(model)) == 5 * 32 * 32
    fusion = 2 * 12 * 5 * 32 * 32
    middle = flops.pass_flops(model, 12, layers=[1])
    final = flops.pass_flops(model, 12, layers=[0, 1, 2]) + fusion + flops.head_flops(model, 12)
    forward = final + middle + 3 * (middle + fusion)
    assert arch.train_flops(12) == pytest.approx(forward + 2 * (final + 2 * (middle + fusion)), rel=1e-12)
    assert _t2mlr(jacobi_tolerance=1e-3).train_flops(12) == arch.train_flops(12)  # counted at its cap


def test_the_jacobi_depths():
    """B >= D adds the gradient of the unfused middle pass (R<1> no longer detached), B > D nothing more;
    D = 1 (an unfused pass, then the final fused one) is the looped model running block 1 twice plus the
    fusion; sampled depths average the fixed ones."""
    depth = lambda d, b: _t2mlr(d_forward=d, d_backward=b).train_flops(12)
    model = _t2mlr().backbone
    middle, fusion = flops.pass_flops(model, 12, layers=[1]), t2mlr_flops.fusion_flops(model, 12)
    assert depth(4, 3) - depth(4, 2) == pytest.approx(2 * (middle + fusion))  # one more refinement
    assert depth(4, 4) - depth(4, 3) == pytest.approx(2 * middle)  # the unfused middle pass
    assert t2mlr_flops.jacobi_train_flops(model, 12, 4, 5) == depth(4, 4)  # a sampled D below B
    assert depth(1, 0) == pytest.approx(depth(1, 1) - 2 * middle)
    looped = tiny_experiment("middle_looped", sections={"looped": {"start": 1, "end": 1, "repeats": 2}})
    looped.data.seq_len, looped.baseline.param_match = 12, False
    twice = build_architecture(resolve(looped), "middle_looped").train_flops(12)
    assert depth(1, 1) == pytest.approx(twice + 3 * fusion, rel=1e-12)
    sampled = _t2mlr(d_forward_values="2,4").train_flops(12)
    assert sampled == pytest.approx((depth(2, 2) + depth(4, 2)) / 2, rel=1e-12)


def test_exact_training_and_its_truncation():
    """Exact recurrence: the causal pass with the fusion at every token. bptt = B runs B + 1 copies; the
    first B count through the middle block's end (their R feeds the next copy), only the last the rest."""
    model = _t2mlr().backbone
    below = flops.pass_flops(model, 12, layers=[0, 1]) + t2mlr_flops.fusion_flops(model, 12)
    rest = flops.pass_flops(model, 12, layers=[2]) + flops.head_flops(model, 12)
    assert _t2mlr(forward_mode="exact").train_flops(12) == pytest.approx(3 * (below + rest), rel=1e-12)
    truncated = _t2mlr(forward_mode="exact", bptt=2).train_flops(12)
    assert truncated == pytest.approx(3 * (3 * below + rest), rel=1e-12)


def test_the_other_trainable_architectures():
    """Pause: the row lengthened by its pauses, the head at each token's last; the LSTM: its matrices and the
    tied head per position; the adaptive recirculation: its frozen base forward, the MLP trained through the
    final pass (the base's matmuls pass the gradient on, 1 forward each, attention 2); the training-free
    recirculation has no count."""
    pause = _arch("pause")
    model = pause.backbone
    want = 3 * (flops.pass_flops(model, 36) + flops.head_flops(model, 12))  # 2 pauses after each token
    assert pause.train_flops(12) == pytest.approx(want, rel=1e-12)
    lstm = tiny_experiment("lstm", sections={"lstm": {"hidden": 8, "layers": 2}})
    vocab = lstm.model.vocab_size
    assert build_architecture(resolve(lstm), "lstm").train_flops(12) == 3 * 2 * 12 * (
        2 * 2 * 8 * 32 + 8 * vocab
    )
    config = tiny_experiment("recirculation_adaptive", sections={"recirculation": PATHWAY})
    recirculation = build_architecture(resolve(config), "recirculation_adaptive")
    model = recirculation.backbone
    mix = 2 * 12 * (2 * 32 * 32 + 32 * 32 + 32 * 2 * 32)  # [z_src; z_dest] -> 32 -> 32 -> (alpha, beta)
    mix_backward = 2 * mix - 2 * 12 * 2 * 32 * 32  # no input gradient of the first layer
    blocks = lambda *layers: flops.pass_flops(model, 12, layers=layers)
    attention = flops.attention_flops(model, 12, [1, 2])
    forward = blocks(0) + blocks(1, 2) + 2 * (mix + 2 * blocks(1, 2)) + mix + blocks(1, 2)
    backward = mix_backward + blocks(1, 2) + attention + flops.head_flops(model, 12)
    head = flops.head_flops(model, 12)
    assert recirculation.train_flops(12) == pytest.approx(forward + head + backward, rel=1e-12)
    assert build_architecture(resolve(config), "recirculation").train_flops is None


def _traced_flops(arch, seq_len: int) -> float:
    """Matmul FLOPs of the traced gradient of `arch`'s training loss on one row (loop bodies x trip count)."""
    ones = jnp.ones((1, seq_len), jnp.int32)
    batch = {"tokens": ones, "positions": jnp.cumsum(ones, 1) - 1, "segment_ids": ones,
             "control_flow": 2 * ones, "targets": ones, "loss_mask": ones}  # fmt: skip

    def loss(params):
        state, sample = arch.init_model_state(), arch.sample(0, 0) if arch.sample else None
        out = arch.apply(
            params, batch, training=True, rng=jax.random.key(0), model_state=state, sample=sample
        )
        return arch.loss(out, batch)["loss"][0]

    params = jax.eval_shape(arch.init, jax.random.key(0))
    return jaxpr_matmul_flops(jax.make_jaxpr(jax.grad(loss))(params).jaxpr)


@pytest.mark.slow
def test_the_counts_are_what_the_train_step_runs(monkeypatch):
    """Each count against the matmul FLOPs of its traced train step, attention dense on both sides (the
    reference einsum scores every key, masked): the same passes, fusions, heads and backwards. Exact
    truncated BPTT runs more than it counts: its first B copies also run their upper blocks and head,
    forward and backward, whose results nothing reads."""

    def build(arch, sections=None, **fields):
        config = tiny_experiment(arch, sections=sections)
        config.data.seq_len, config.baseline.param_match = 12, False
        config.model.attention_impl = "einsum"
        for key, value in fields.items():
            section = config.model.recurrence if key in config.model.recurrence else config.t2mlr
            section[key] = value
        return build_architecture(resolve(config), arch)

    cases = [build("t2mlr"), build("t2mlr", d_backward=4), build("t2mlr", d_forward=1, d_backward=1),
             build("t2mlr", forward_mode="exact"), build("transformer"), build("pause"),
             build("lstm", sections={"lstm": {"hidden": 8, "layers": 2}}),
             build("middle_looped", sections={"looped": {"start": 1, "end": 1, "repeats": 3}})]  # fmt: skip
    truncated = build("t2mlr", forward_mode="exact", bptt=2)
    traced = [_traced_flops(arch, 12) for arch in [*cases, truncated]]
    monkeypatch.setattr(flops, "mean_keys", lambda length, window: float(length))
    for arch, want in zip(cases, traced):
        assert arch.train_flops(12) == pytest.approx(want, rel=1e-12), arch.name
    model = truncated.backbone
    unread = flops.pass_flops(model, 12, layers=[2]) + flops.head_flops(model, 12)
    assert truncated.train_flops(12) + 2 * 3 * unread == pytest.approx(traced[-1], rel=1e-12)


def test_a_flop_budget_sets_the_steps_when_the_config_is_resolved(tmp_path):
    from t2mlr_jax.train.trainer import Run

    config = tiny_experiment("transformer", steps=1000)
    config.train.flop_budget = 0.0
    per_step = Run(resolve(config), tmp_path / "a", tiny_source(), "transformer").flops_per_step
    config.train.flop_budget = 7.4 * per_step
    typed = resolve(config)
    assert typed.train.steps == 7 and config.train.steps == 1000  # the typed copy
    assert Run(typed, tmp_path / "b", tiny_source(), "transformer").config.train.steps == 7  # as resolved
    t2mlr = tiny_experiment("t2mlr", steps=1000)
    t2mlr.train.flop_budget = 7.4 * per_step
    run = Run(resolve(t2mlr), tmp_path / "c", tiny_source(), "t2mlr")
    jacobi = t2mlr_flops.jacobi_train_flops(run.arch.backbone, t2mlr.data.seq_len)
    assert run.config.train.steps == round(7.4 * per_step / (8 * jacobi)) < 7  # T²MLR's steps cost more
    t2mlr.arch = "t2mlr,transformer"  # a comma list: each architecture its own steps (main.py's plan)
    both = resolve(t2mlr)
    steps = [for_arch(both, name).train.steps for name in ("t2mlr", "transformer")]
    assert steps == [run.config.train.steps, 7]
    with pytest.raises(ValueError, match="architecture 'recirculation' has no training FLOP accounting"):
        bad = tiny_experiment("recirculation", sections={"recirculation": PATHWAY})
        bad.train.flop_budget = 1e9
        resolve(bad)


def test_t2mlrs_cost_at_smollm2_135m():
    """configs/smollm135m_t2mlr.py:w13_18 (code blocks 12..17 of 30, D 16, B 4) at its 2048-token rows costs
    2.42x the plain backbone's training FLOPs, 2.39x the parameter-matched baseline's (584 wide); the
    benchmarks' MFU counts the same (t2mlr_jax/studies/benchmarks/flops.py: the architecture's count)."""
    config = load_config("smollm135m_t2mlr", "w13_18")
    t2mlr, seq = build_architecture(resolve(config)), config.data.seq_len
    model, rec = t2mlr.backbone, t2mlr.backbone.recurrence
    assert (seq, model.layer_range, rec.d_forward, rec.d_backward) == (2048, (12, 17), 16, 4)
    plain = model.replace(recurrence=None)
    baseline = build_architecture(resolve(load_config("smollm135m_t2mlr", "baseline")))
    assert t2mlr.train_flops(seq) / flops.one_pass_train_flops(plain, seq) == pytest.approx(2.418, abs=5e-4)
    assert t2mlr.train_flops(seq) / baseline.train_flops(seq) == pytest.approx(2.392, abs=5e-4)
    assert expected_train_flops(model, 1, seq, 16, 4) == t2mlr.train_flops(seq)


def test_the_comparison_rows_have_the_papers_parameter_ratios():
    """Table 1 (16L): total parameters over vanilla 1x, read off the parameter tables (nothing is built)."""
    want = {"vanilla2x": 1.92, "vanilla3x": 2.83, "loop3": 1.00, "lrt1x": 1.04, "lrt2x": 2.00,
            "lrt3x": 2.96, "tt1": 1.04, "ponder1": 1.00}  # fmt: skip
    base = build_architecture(resolve(load_config("lrt_comparison", "vanilla1x,paper"))).num_params()
    for row, ratio in want.items():
        config = load_config("lrt_comparison", f"{row},paper")
        assert build_architecture(resolve(config)).num_params() / base == pytest.approx(ratio, abs=0.006), row
    with pytest.raises(ValueError, match="lrt_comparison takes one row and at most one scale"):
        load_config("lrt_comparison", "tt1,tt2")
