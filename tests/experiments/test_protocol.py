"""The shared comparison protocol on inputs whose answers are known by hand."""

import math

import numpy as np
import pytest

from t2mlr_jax.studies import protocol

T_975_2DOF = 4.302652729911275  # Student t, 95% two-sided, 2 degrees of freedom


def test_interval_is_the_student_t_interval_of_the_mean():
    got = protocol.interval([1.0, 2.0, 3.0])
    half = T_975_2DOF * 1.0 / math.sqrt(3)
    assert (got.mean, got.std, got.n) == (2.0, 1.0, 3)
    assert (got.low, got.high) == pytest.approx((2 - half, 2 + half))
    assert got.text(2) == f"2.00 ± {half:.2f}"
    with pytest.raises(ValueError, match="at least 2 values"):
        protocol.interval([1.0])


def test_paired_difference_pairs_seeds_and_the_verdict_reads_its_interval():
    row, baseline = {0: 1.0, 1: 2.0, 2: 3.5}, {0: 0.5, 1: 1.0, 2: 2.0}
    diff = protocol.paired_difference(row, baseline)  # differences 0.5, 1.0, 1.5
    assert (diff.mean, diff.std) == pytest.approx((1.0, 0.5))
    assert diff.half_width == pytest.approx(T_975_2DOF * 0.5 / math.sqrt(3))
    assert diff.includes_zero and protocol.verdict(diff, -1) == protocol.INCONCLUSIVE
    tight = protocol.paired_difference({0: 1.0, 1: 1.1, 2: 1.2}, {0: 0.0, 1: 0.1, 2: 0.1})
    assert protocol.verdict(tight, +1) == protocol.REPRODUCED
    assert protocol.verdict(tight, -1) == protocol.NOT_REPRODUCED
    with pytest.raises(ValueError, match=r"seeds \[3\]"):
        protocol.paired_difference({**row, 3: 0.0}, baseline)
    with pytest.raises(ValueError, match="at least 3 distinct seeds"):
        protocol.check_seeds([0, 1, 1])


def test_selection_and_report_splits_are_disjoint_complete_and_seeded():
    parts = protocol.splits(10, 0.3, seed=4)
    assert len(parts.selection) == 3 and not set(parts.selection) & set(parts.report)
    assert sorted([*parts.selection, *parts.report]) == list(range(10))
    again = protocol.splits(10, 0.3, seed=4)
    assert np.array_equal(parts.selection, again.selection)
    with pytest.raises(ValueError, match="leave a split empty"):
        protocol.splits(1)


def test_rows_reading_more_per_step_revisit_the_same_unique_tokens():
    """Each row's summary counts its tokens (trainer.tokens_read); rows capped at one data.train_tokens see
    the same unique text however many tokens a step reads, and an uncapped or shorter row is refused."""
    from t2mlr_jax.experiment import resolve
    from t2mlr_jax.train.trainer import tokens_read
    from tests.train.test_build_data import load_config

    def summary(seq_len: int, steps: int, cap: int) -> dict:
        config = load_config("smollm135m_t2mlr", "cpu")
        config.data.seq_len, config.data.train_tokens, config.train.batch_size = seq_len, cap, 4
        return tokens_read(resolve(config), steps)

    rows = {"vanilla": summary(64, 10, 2560), "thoughts": summary(192, 10, 2560)}  # 3x the tokens a step
    protocol.check_equal_data(rows)
    assert rows["vanilla"]["train_tokens_read"] == 2560 and rows["thoughts"]["train_tokens_read"] == 7680
    with pytest.raises(ValueError, match="different unique data"):
        protocol.check_equal_data({**rows, "short": summary(64, 2, 2560)})
    with pytest.raises(ValueError, match="None: not capped"):
        protocol.check_equal_data({**rows, "uncapped": summary(64, 10, 0)})


def test_an_unconverged_iteration_is_marked_or_refused():
    done = protocol.Convergence(passes=16, final_change=1e-7, tolerance=1e-5)
    capped = protocol.Convergence(passes=16, final_change=3e-2, tolerance=1e-5)
    assert done.marked({"bpb": 1.0})["converged"] is True
    marked = capped.marked({"bpb": 1.0})
    assert marked["converged"] is False and marked["final_change"] == 3e-2 and marked["bpb"] == 1.0
    with pytest.raises(ValueError, match="unconverged after 16 passes"):
        capped.marked({"bpb": 1.0}, refuse=True)


def test_a_study_table_gives_each_claim_its_interval_verdict_and_the_noise_floor():
    values = {
        "baseline": {0: 1.00, 1: 1.02, 2: 0.98},
        "better": {0: 0.90, 1: 0.92, 2: 0.88},  # lower by 0.10 each seed
        "noisy": {0: 1.10, 1: 0.95, 2: 0.97},  # +0.10, −0.07, −0.01: straddles zero
    }
    claims = [
        protocol.Claim("better", "baseline", "−0.03 BPB", -1),
        protocol.Claim("noisy", "baseline", "−0.02 BPB", -1),
    ]
    result = protocol.compare(values, claims)
    assert result["noise_floor"] == pytest.approx(0.02)
    better, noisy = result["claims"]
    assert better["difference"]["mean"] == pytest.approx(-0.10) and better["verdict"] == protocol.REPRODUCED
    assert noisy["verdict"] == protocol.INCONCLUSIVE
    table = protocol.markdown(result, "BPB")
    assert "| better vs baseline | −0.03 BPB | -0.100 ± 0.000 | reproduced at this scale |" in table
    assert "| baseline | 1.000 ± 0.050 | 0.020 | 3 |" in table
    assert "noise floor (std of baseline): 0.020" in table
    with pytest.raises(ValueError, match="at least 3 distinct seeds"):
        protocol.compare({**values, "short": {0: 1.0, 1: 1.0}}, claims)
    with pytest.raises(ValueError, match=r"claims name rows \['vanilla'\]"):
        protocol.compare(values, [protocol.Claim("better", "vanilla", "", -1)])


@pytest.mark.parametrize("arch, head_passes", [("transformer", 1), ("lrt", None)])
def test_head_share_counts_every_head_pass(arch, head_passes):
    """Read off the count at two vocabulary sizes: for a transformer, exactly its one head pass (forward
    and backward); for the LRT, more than one pass's share, for its head runs on every refinement."""
    from t2mlr_jax.architectures import build_architecture
    from t2mlr_jax.experiment import resolve
    from t2mlr_jax.model import flops
    from tests.tiny import tiny_experiment

    config = tiny_experiment(arch)
    config.data.seq_len, config.baseline.param_match = 12, False

    def train_flops_at(vocab: int) -> float:
        config.model.vocab_size = vocab
        return build_architecture(resolve(config), arch).train_flops(12)

    vocab = tiny_experiment(arch).model.vocab_size
    share = protocol.head_share(train_flops_at, vocab)
    config.model.vocab_size = vocab
    cfg = resolve(config).model
    one_pass = flops.train(flops.head_flops(cfg, 12)) / train_flops_at(vocab)
    if head_passes:
        assert share == pytest.approx(head_passes * one_pass)
    else:
        assert 0 < share < 1 and share > one_pass


def test_a_claim_of_no_difference_needs_the_interval_inside_its_margin():
    inside, straddling, outside = (
        protocol.Interval(m, 0.01, m - 0.01, m + 0.01, 3) for m in (0.0, 0.02, 0.05)
    )
    assert protocol.verdict(inside, 0, margin=0.02) == protocol.REPRODUCED
    assert protocol.verdict(straddling, 0, margin=0.02) == protocol.INCONCLUSIVE
    assert protocol.verdict(outside, 0, margin=0.02) == protocol.NOT_REPRODUCED
    with pytest.raises(ValueError, match="needs a margin"):
        protocol.verdict(inside, 0)
