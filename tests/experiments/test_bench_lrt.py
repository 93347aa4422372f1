"""experiments/bench_lrt.py: --help, and one run of the test-sized preset (compiled unoptimised, one
repetition) writing the JSON and markdown with every ratio. Timings themselves are not tested."""

import importlib.util
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load_bench_lrt():
    """The script as users run it (a file, not an installed package); it makes its package importable."""
    path = os.path.join(ROOT, "experiments", "bench_lrt.py")
    spec = importlib.util.spec_from_file_location("bench_lrt", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench_lrt = _load_bench_lrt()


def test_help_lists_the_flags(capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench_lrt.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--preset", "--sections", "--out_dir", "--repeats", "{test,quick,full}"):
        assert flag in out
    with pytest.raises(SystemExit, match="unknown"):
        bench_lrt.resolve_sections("decode,speed")


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


def test_test_preset_writes_json_and_markdown_with_the_ratios(tmp_path):
    bench_lrt.main(["--preset=test", f"--out_dir={tmp_path}"])
    result = json.loads((tmp_path / "bench_lrt_test.json").read_text())
    assert {"preset", "command", "device", "backbone", "lrt_params", "wall_seconds"} <= set(result["meta"])
    assert result["meta"]["lrt_params"] > result["meta"]["vanilla_params"]
    decode = {r["variant"]: r for r in result["sections"]["decode"]["rows"]}
    assert set(decode) == {"vanilla", "LRT"} and decode["vanilla"]["ratio"] == 1.0
    assert {"ratio", "generate_ratio", "decode_seconds_per_token", "prefill_seconds"} <= set(decode["LRT"])
    train = result["sections"]["train"]
    assert [r["variant"] for r in train["rows"]] == ["vanilla", "LRT P=2"]
    for row in [*train["rows"], train["expected"]]:
        assert {"time_ratio", "flop_ratio", "model_flop_ratio", "time_over_flop_ratio"} <= set(row)
    lrt2 = train["rows"][1]
    # Two passes with gradients through both: about twice vanilla's forward-backward matmuls (plus the
    # feedback projections), fewer for the whole step, whose Muon update is the same.
    assert 2.0 < lrt2["model_flop_ratio"] < 3.0 and lrt2["flop_ratio"] < lrt2["model_flop_ratio"]
    assert train["expected"]["passes"] == 2.0
    assert train["expected"]["flop_ratio"] == pytest.approx(lrt2["flop_ratio"])
    markdown = (tmp_path / "bench_lrt_test.md").read_text()
    assert "## Decode" in markdown and "## Train step" in markdown and "LRT E[P]" in markdown
