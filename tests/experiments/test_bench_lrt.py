"""experiments/bench_lrt.py: --help, and one run of the test-sized preset (compiled unoptimised, one
repetition) writing the JSON and markdown with every ratio. Timings themselves are not tested; what the
traced programs say (FLOP counts, the rows' decode blocks per token) is."""

import json

import pytest

from t2mlr_jax.studies.benchmarks import bench_lrt


def test_help_lists_the_flags(capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench_lrt.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--preset", "--sections", "--out_dir", "--repeats", "--rows", "{test,quick,full}"):
        assert flag in out
    with pytest.raises(SystemExit, match="unknown"):
        bench_lrt.resolve_sections("decode,speed")
    with pytest.raises(SystemExit, match=r"unknown \['tt3'\]"):
        bench_lrt.resolve_rows("tt1,tt3")
    assert bench_lrt.resolve_rows("tt1, lrt1x,tt1") == ("tt1", "lrt1x")


def test_full_preset_is_the_papers_reference_and_protocol():
    full = bench_lrt.lrt.PRESETS["full"]
    assert (full.model.num_layers, full.model.hidden_size, full.model.mlp, full.model.dtype) == (
        16,
        1024,
        "moe",
        "bfloat16",
    )
    assert (full.decode_batch, full.prompt_len, full.new_tokens) == (128, 1024, 1024)
    assert full.passes == (1, 2, 3, 4) and full.pass_probs == (0.4, 0.3, 0.2, 0.1)
    # Every row of Table 1, at the comparison's paper scale (whose backbone is this one) for the full
    # preset; each a row of configs/lrt_comparison.py.
    table1 = ("vanilla1x", "vanilla2x", "vanilla3x", "loop2", "loop3", "loop4", "lrt1x", "lrt2x", "lrt3x")
    table1 += ("tt1", "tt2", "ponder1", "ponder2")
    assert full.rows == bench_lrt.lrt.PRESETS["quick"].rows == table1 and full.rows_scale == "paper"
    assert not bench_lrt.lrt_rows.comparison().unknown_rows(table1)
    assert bench_lrt.lrt.PAPER_ROW_RATIOS["tt1"] == 2.3


@pytest.mark.slow
def test_test_preset_writes_json_and_markdown_with_the_ratios(tmp_path):
    bench_lrt.main(["--preset=test", f"--out_dir={tmp_path}"])
    result = json.loads((tmp_path / "bench_lrt_test.json").read_text())
    assert {"preset", "command", "device", "backbone", "lrt_params", "wall_seconds"} <= set(result["meta"])
    assert result["meta"]["lrt_params"] > result["meta"]["vanilla_params"]
    decode = {r["variant"]: r for r in result["sections"]["decode"]["rows"]}
    assert set(decode) == {"vanilla", "LRT"} and decode["vanilla"]["ratio"] == 1.0
    assert {"ratio", "generate_ratio", "decode_seconds_per_token", "prefill_seconds"} <= set(decode["LRT"])
    train = result["sections"]["train"]
    assert [r["variant"] for r in train["rows"]] == ["vanilla", "LRT P=1"]
    for row in [*train["rows"], train["expected"]]:
        assert {"time_ratio", "flop_ratio", "model_flop_ratio", "time_over_flop_ratio"} <= set(row)
    lrt1 = train["rows"][1]
    # Pass 0 and one refinement, gradients through both: about twice vanilla's forward-backward matmuls
    # (plus the feedback projections), fewer for the whole step, whose Muon update is the same.
    assert 2.0 < lrt1["model_flop_ratio"] < 3.0 and lrt1["flop_ratio"] < lrt1["model_flop_ratio"]
    assert train["expected"]["passes"] == 1.0 and train["rows"][0]["passes"] == 0
    assert train["expected"]["flop_ratio"] == pytest.approx(lrt1["flop_ratio"])
    rows = {r["row"]: r for r in result["sections"]["rows"]["rows"]}
    assert list(rows) == ["vanilla1x", "lrt1x", "tt1", "ponder1", "loop2"]
    for name, row in rows.items():
        assert row["error"] is None and row["ratio"] > 0 and row["seconds_per_token"] > 0
        assert len(row["generate_seconds_all"]) == 1
        # Read off the traced generate: the token loop's KV cache has a layer per executed block (loop2:
        # the 2 layers twice) and K + 1 slots per vocabulary token (tt1 / ponder1 at their largest trained
        # K = 1), as the config says.
        assert row["decode_layers"] == (4 if name == "loop2" else 2)
        assert row["slots_per_token"] == row["thoughts"] + 1
        assert row["blocks_per_token"] == row["expected_blocks_per_token"]
    assert rows["vanilla1x"]["ratio"] == 1.0 and rows["vanilla1x"]["flop_ratio"] == 1.0
    assert (rows["tt1"]["thoughts"], rows["ponder1"]["thoughts"], rows["lrt1x"]["thoughts"]) == (1, 1, 0)
    assert (rows["tt1"]["paper_ratio"], rows["ponder1"]["paper_ratio"]) == (2.3, 2.1)
    # One decode step's matmuls: the LRT adds its feedback projections to vanilla's; a thought row runs
    # two slots through the blocks (attending a cache twice as long), the head once; TT1 = PonderLM-2 +
    # the LRT's feedback.
    assert 1.0 < rows["lrt1x"]["flop_ratio"] < 1.5
    assert 1.5 < rows["ponder1"]["flop_ratio"] < rows["tt1"]["flop_ratio"] < 3.0
    assert rows["tt1"]["params"] > rows["lrt1x"]["params"] > rows["ponder1"]["params"]
    assert rows["ponder1"]["params"] == rows["vanilla1x"]["params"] == result["meta"]["vanilla_params"]
    markdown = (tmp_path / "bench_lrt_test.md").read_text()
    assert "## Decode" in markdown and "## Train step" in markdown and "LRT E[P]" in markdown
    assert "## Table 1 rows" in markdown and "| tt1 | LRT + 1 thought token | 1 | 4 |" in markdown
