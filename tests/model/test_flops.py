"""Expected training FLOPs (t2mlr_jax.model.flops, Appendix C.1): the formula by hand on a toy model, MoE
counting active experts, each architecture's accounting, train.flop_budget, and configs/lrt_comparison.py's
rows at the paper's sizes (Table 1's parameter ratios)."""

import pytest

from t2mlr_jax.architectures import lrt, lrt_forward
from t2mlr_jax.experiment import resolve
from t2mlr_jax.model import flops
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.train.init_from import architecture
from tests.tiny import tiny_experiment
from tests.train.test_build_data import load_config
from tests.train.tiny_task import tiny_source

TOY = ModelConfig(
    vocab_size=50, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=2, head_dim=16, mlp_dim=64
).validate()


def test_a_pass_by_hand():
    block = 4 * 32 * 32 + 3 * 32 * 64  # q, k, v, o + SwiGLU's three matrices
    attention = 4 * 4 * 2.5 * 2 * 16  # 4 queries see 2.5 keys on average, 2 heads of 16
    assert flops.block_params(TOY) == block
    assert flops.pass_flops(TOY, 4) == 2 * (2 * 4 * block + attention)
    assert flops.head_flops(TOY, 3) == 2 * 3 * 32 * 50
    windowed = TOY.replace(window_pattern="SL", sliding_window=1).validate()  # layer 0 sees <= 2 keys
    assert flops.pass_flops(windowed, 4) == flops.pass_flops(TOY, 4) - 4 * 4 * (2.5 - 1.75) * 2 * 16


def test_moe_counts_the_active_experts_only():
    moe = TOY.replace(mlp="moe", moe_experts=8, moe_top_k=2, moe_shared=1, moe_dim=24).validate()
    routed = 2 * (2 * 32 * 24)  # two of the eight relu² experts
    assert flops.block_params(moe) == 4 * 32 * 32 + 32 * 8 + routed + 2 * 32 * 24


def _arch(arch="lrt", seq_len=12, **lrt_settings):
    config = tiny_experiment(arch)
    config.data.seq_len, config.baseline.param_match = seq_len, False
    for key, value in lrt_settings.items():
        config.lrt[key] = value
    return architecture(resolve(config), arch)


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
    assert _arch("t2mlr").train_flops is None  # no accounting: a flop budget is refused


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
    ponder = architecture(resolve(config), "ponderlm2")
    assert ponder.train_flops(12) == pytest.approx(
        3 * (forward(4, 0) + 3 * forward(12, 0) + head(4)), rel=1e-12
    )


def test_a_flop_budget_sets_the_steps_before_anything_compiles(tmp_path):
    from t2mlr_jax.train.trainer import Run

    config = tiny_experiment("transformer", steps=1000)
    config.train.flop_budget = 0.0
    per_step = Run(resolve(config), tmp_path / "a", tiny_source(), "transformer").flops_per_step
    config.train.flop_budget = 7.4 * per_step
    run = Run(resolve(config), tmp_path / "b", tiny_source(), "transformer")
    assert run.config.train.steps == 7 and config.train.steps == 1000  # the run's own copy
    with pytest.raises(ValueError, match="architecture 't2mlr' has no training FLOP accounting"):
        bad = tiny_experiment("t2mlr")
        bad.train.flop_budget = 1e9
        Run(resolve(bad), tmp_path / "c", tiny_source(), "t2mlr")
    assert not (tmp_path / "c").exists()


def test_the_comparison_rows_have_the_papers_parameter_ratios():
    """Table 1 (16L): total parameters over vanilla 1x, read off the parameter tables (nothing is built)."""
    want = {"vanilla2x": 1.92, "vanilla3x": 2.83, "loop3": 1.00, "lrt1x": 1.04, "lrt2x": 2.00,
            "lrt3x": 2.96, "tt1": 1.04, "ponder1": 1.00}  # fmt: skip
    base = architecture(resolve(load_config("lrt_comparison", "vanilla1x,paper"))).num_params()
    for row, ratio in want.items():
        config = load_config("lrt_comparison", f"{row},paper")
        assert architecture(resolve(config)).num_params() / base == pytest.approx(ratio, abs=0.006), row
    with pytest.raises(ValueError, match="lrt_comparison takes one row and at most one scale"):
        load_config("lrt_comparison", "tt1,tt2")
