"""experiments/bench.py and its benchmarks package: the helpers, --help, and one run of the test-sized
preset (1 repetition) writing the JSON and markdown. Timings themselves are not tested."""

import json

import pytest

from t2mlr_jax.model.presets import smollm2_135m
from t2mlr_jax.studies.benchmarks import bench


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
        # The counting formula and the traced program agree on every matmul.
        assert row["flops"] == pytest.approx(row["flops_jaxpr"], rel=1e-9)
    assert {"speedup", "max_abs_logit_diff", "mean_loss_diff"} <= set(sections["prefill"]["rows"][0])
    assert {"temp_bytes", "peak_bytes", "peak_ratio"} <= set(sections["memory"]["train_rows"][0])
    assert sections["memory"]["decode_rows"][1]["recurrent_state_bytes"] > 0
    assert all(row["mfu"] is None and row["tokens_per_second"] > 0 for row in sections["throughput"]["rows"])
    markdown = (tmp_path / "bench_smoke.md").read_text()
    for section in bench.SECTIONS.values():
        assert f"## {section.TITLE}" in markdown
