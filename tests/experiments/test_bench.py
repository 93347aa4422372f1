"""experiments/bench.py and its benchmarks package: the helpers, --help, and one run of the test-sized
preset (1 repetition) writing the JSON and markdown. Timings themselves are not tested."""

import json

import jax
import jax.numpy as jnp
import optax
import pytest

from t2mlr_jax.architectures import build_architecture, flops_per_step
from t2mlr_jax.architectures.t2mlr import flops as t2mlr_flops
from t2mlr_jax.experiment import resolve
from t2mlr_jax.model import flops
from t2mlr_jax.model.params import init_params
from t2mlr_jax.model.presets import smollm2_135m
from t2mlr_jax.studies.benchmarks import bench, harness, presets
from t2mlr_jax.studies.benchmarks.flops import expected_decode_flops, expected_train_flops, jaxpr_matmul_flops
from tests.tiny import tiny_experiment

# The traced step computes attention dense (the masked scores too), the count causal: at the smoke preset's
# 16-token rows the trace is above the count by the masked half of attention: 3.2% (T²MLR), 2.7% (baseline).
DENSE_ATTENTION_EXCESS = 0.05


def test_help_lists_the_flags(capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--preset", "--sections", "--out_dir", "--repeats", "--peak_tflops", "{smoke,quick,full}"):
        assert flag in out


def test_paper_ranges_map_to_code_indices_and_scale_down():
    assert [bench.presets.code_range(r, 30) for r in ("(1,30)", "(5,26)", "(9,22)", "(13,18)")] == [
        (0, 29),
        (4, 25),
        (8, 21),
        (12, 17),
    ]
    assert [bench.presets.code_range(r, 8) for r in ("(1,30)", "(5,26)", "(9,22)", "(13,18)")] == [
        (0, 7),
        (1, 6),
        (2, 5),
        (3, 4),
    ]
    assert bench.presets.code_range("(13,18)", 4) == (1, 2)  # never l_end < l_start


def test_matched_baseline_is_the_releases_584_wide_transformer():
    baseline = bench.presets.matched_baseline(smollm2_135m())
    assert baseline.hidden_size == 584 and baseline.recurrence is None


def test_unknown_section_is_one_clear_error():
    with pytest.raises(SystemExit, match="unknown"):
        bench.resolve_sections("decode,speed")
    assert bench.resolve_sections("throughput") == ["decode", "train", "throughput"]


def test_the_benchmarks_count_is_the_architectures():
    """One source of truth: a benchmarked train step's expected FLOPs are flops_per_step of the architecture
    the trainer builds (T²MLR at the step's D and B; the baseline as given), and generate()'s are the exact
    forward over the positions it feeds (the prompt and every new token but the last)."""
    config = tiny_experiment("t2mlr")
    config.baseline.param_match = False
    typed = resolve(config)
    rows, seq, model = typed.train.batch_size, typed.data.seq_len, typed.model
    plain, depths = model.replace(recurrence=None), (model.recurrence.d_forward, model.recurrence.d_backward)
    for name, cfg in (("t2mlr", model), ("transformer", plain)):
        want = flops_per_step(typed, build_architecture(typed, name))
        assert expected_train_flops(cfg, rows, seq, *depths) == want, name
    assert flops.train(expected_decode_flops(model, 2, 3, 5) / 2) == pytest.approx(
        t2mlr_flops.exact_train_flops(model, 7), rel=1e-12
    )
    assert flops.train(expected_decode_flops(plain, 1, 3, 5)) == pytest.approx(
        flops.one_pass_train_flops(plain, 7), rel=1e-12
    )


def test_the_traced_step_is_the_count_with_attention_dense(monkeypatch):
    """The measured count (the dot_generals of the train section's traced step, shapes only) against the
    expected one, on the smoke preset's T²MLR and baseline: above it by DENSE_ATTENTION_EXCESS at most,
    and equal to it with attention counted dense."""
    p = presets.PRESETS["smoke"]
    optimizer = optax.adamw(1e-3)
    tokens = jax.ShapeDtypeStruct((p.train_batch, p.train_seq), jnp.int32)
    shape = (p.train_batch, p.train_seq, p.d_forward, p.d_backward)
    for cfg in (presets.with_range(p.model, "(13,18)"), presets.matched_baseline(p.model)):
        params = jax.eval_shape(lambda cfg=cfg: init_params(cfg, jax.random.PRNGKey(0)))
        step = harness.compile_jacobi_step(cfg, p.d_forward, p.d_backward, optimizer)
        traced = jaxpr_matmul_flops(step.trace(params, jax.eval_shape(optimizer.init, params), tokens).jaxpr)
        counted = expected_train_flops(cfg, *shape)
        assert counted < traced < (1 + DENSE_ATTENTION_EXCESS) * counted
        with monkeypatch.context() as patch:
            patch.setattr(flops, "mean_keys", lambda length, window: float(length))
            assert expected_train_flops(cfg, *shape) == pytest.approx(traced, rel=1e-12)


@pytest.mark.slow
def test_smoke_preset_writes_json_and_markdown(tmp_path):
    bench.main(["--preset=smoke", "--repeats=1", f"--out_dir={tmp_path}"])
    result = json.loads((tmp_path / "bench_smoke.json").read_text())
    sections = result["sections"]
    assert list(sections) == list(bench.SECTIONS)
    assert {"preset", "command", "device", "t2mlr", "baseline", "wall_seconds"} <= set(result["meta"])
    assert {"ratio", "seconds", "baseline_seconds", "new_tokens", "batch"} <= set(
        sections["decode"]["rows"][0]
    )
    for row in sections["train"]["rows"]:
        assert {
            "time_ratio",
            "flop_ratio",
            "flop_ratio_jaxpr",
            "flop_ratio_xla",
            "time_over_flop_ratio",
        } <= set(row)
        # The architecture's count and the traced program's (attention dense there) agree.
        assert row["flops"] < row["flops_jaxpr"] < (1 + DENSE_ATTENTION_EXCESS) * row["flops"]
    assert {"speedup", "max_abs_logit_diff", "mean_loss_diff"} <= set(sections["prefill"]["rows"][0])
    assert {"temp_bytes", "peak_bytes", "peak_ratio"} <= set(sections["memory"]["train_rows"][0])
    assert sections["memory"]["decode_rows"][1]["recurrent_state_bytes"] > 0
    assert all(row["mfu"] is None and row["tokens_per_second"] > 0 for row in sections["throughput"]["rows"])
    markdown = (tmp_path / "bench_smoke.md").read_text()
    for section in bench.SECTIONS.values():
        assert f"## {section.TITLE}" in markdown
