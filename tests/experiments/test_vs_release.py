"""experiments/vs_release.py without the releases: --help, the how-to and one `error:` line (exit 2) when
--release_src is missing, one line for a path that is not a checkout or an unknown --release, and the
summary / markdown / JSON writer on synthetic runs of every release. Nothing is timed here (our drivers'
dry runs: test_vs_release_ours.py)."""

import json
import subprocess
import sys

import pytest

from t2mlr_jax.studies.benchmarks import vs_release


def exit_code(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as exit_info:
        vs_release.main(argv)
    return exit_info.value.code


def test_help_lists_the_flags(capsys):
    assert exit_code(["--help"]) == 0
    out = capsys.readouterr().out
    for flag in "--release --release_src --release_python --rounds --repeats --threads --quick --out".split():
        assert flag in out


def test_without_release_src_it_prints_how_to_get_it(tmp_path, capsys):
    assert exit_code([f"--out={tmp_path / 'out'}"]) == 2
    captured = capsys.readouterr()
    assert "git clone https://github.com/princeton-pli/T2MLR" in captured.out
    assert "pip install torch==2.13.0 'transformers==4.57.*'" in captured.out
    assert 'sys.modules["components.t2mlr_utils"] = components.rcot_utils' in captured.out
    err = captured.err.strip()
    assert err.startswith("error: --release_src is required") and "\n" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "release, clone",
    [
        ("lrt", "git clone https://github.com/OoDBag/Latent_recurrent_transformer"),
        ("ponderlm2", "git clone https://github.com/LUMIA-Group/PonderLM-2"),
    ],
)
def test_each_release_says_how_to_get_it(tmp_path, capsys, release, clone):
    assert exit_code([f"--release={release}", f"--out={tmp_path / 'out'}"]) == 2
    captured = capsys.readouterr()
    assert clone in captured.out
    assert captured.err.strip().startswith("error: --release_src is required: a checkout of")
    assert not (tmp_path / "out").exists()


def test_an_unknown_release_fails_in_one_line(tmp_path, capsys):
    assert exit_code(["--release=nanochat", f"--release_src={tmp_path}", f"--out={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: argument --release: invalid choice: 'nanochat'") and "\n" not in err


def test_a_bad_profile_window_fails_in_one_line_before_anything_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(vs_release.RELEASES["lrt"].release, "check_release", lambda src, python: None)
    argv = ["--release=lrt", f"--release_src={tmp_path}", "--profile=3", f"--out={tmp_path / 'out'}"]
    assert exit_code(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --profile must be START:STOP") and "\n" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("release", ["t2mlr", "lrt", "ponderlm2"])
@pytest.mark.parametrize("make", [lambda tmp: tmp / "missing", lambda tmp: tmp])
def test_a_path_that_is_no_checkout_fails_in_one_line(tmp_path, capsys, make, release):
    argv = [f"--release={release}", f"--release_src={make(tmp_path)}", f"--out={tmp_path / 'out'}"]
    assert exit_code(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --release_src") and "\n" not in err
    assert not (tmp_path / "out").exists()


def run(side: str, round_: int, train_s: float, decode_s: float, rss: int, models=("t2mlr", "plain")) -> dict:
    """A driver's JSON line (what vs_release_torch.py / vs_release_ours.py print), with a round number."""
    params = dict(zip(models, (136_175_042, 134_515_008)))
    programs = {}
    for name, scale in zip(models, (1.0, 0.5)):
        seconds = {"train": [train_s * scale, 2 * train_s * scale], "decode": [decode_s * scale]}
        programs[f"{name}_train"] = {"seconds": seconds["train"], "params": params[name]}
        programs[f"{name}_decode"] = {"seconds": seconds["decode"], "new_tokens": 64, "params": params[name]}
        if side == "ours":
            for kind in ("train", "decode"):
                programs[f"{name}_{kind}"]["compile_s"] = 30.0 + round_
    versions = {"release": {"torch": "2.13.0+cpu", "transformers": "4.57.6"}, "ours": {"jax": "0.10.2"}}
    return {
        "round": round_,
        "side": side,
        "versions": {**versions[side], "python": "3.11.7", "device": "cpu"},
        "programs": programs,
        "peak_rss_bytes": rss,
        "wall_s": 100.0,
    }


def test_writer_reports_medians_of_per_round_ratios(tmp_path):
    gib = 1024**3
    runs = [
        run("release", 0, train_s=6.0, decode_s=4.0, rss=4 * gib),
        run("ours", 0, train_s=3.0, decode_s=1.0, rss=2 * gib),
        run("release", 1, train_s=8.0, decode_s=4.0, rss=4 * gib),
        run("ours", 1, train_s=2.0, decode_s=2.0, rss=3 * gib),
    ]
    spec = {
        "model": {"num_layers": 30, "hidden_size": 576},
        "recurrence": dict(l_start=12, l_end=17, d_forward=16, d_backward=4, temporal_residual=True),
        "train": {"batch": 1, "seq_len": 256},
        "decode": {"batch": 1, "prompt_len": 16, "new_tokens": 64},
    }
    meta = {
        "command": "python -m experiments.vs_release --release_src=T2MLR",
        "release": "t2mlr",
        "preset": "configs/smollm135m_t2mlr.py:w13_18",
        "spec": spec,
        "rounds": 2,
        "repeats": 2,
        "threads": 2,
        "release_src": "T2MLR",
        "release_commit": "no git metadata",
        "versions": {side: runs[i]["versions"] for i, side in enumerate(("release", "ours"))},
    }
    markdown = vs_release.write_results(tmp_path, meta, runs)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert (tmp_path / "results.md").read_text() == markdown
    assert saved["runs"] == runs and saved["meta"] == meta
    rows = saved["summary"]
    # Per-run medians: release train 9, 12; ours 4.5, 3 -> ratios 2, 4 -> median 3.
    assert rows["t2mlr_train"]["release_s"] == pytest.approx(10.5)
    assert rows["t2mlr_train"]["ours_s"] == pytest.approx(3.75)
    assert rows["t2mlr_train"]["speed_ratio"] == pytest.approx(3.0)
    assert rows["t2mlr_decode"]["speed_ratio"] == pytest.approx(3.0)  # ratios 4 and 2
    assert rows["plain_train"]["compile_s"] == pytest.approx(30.0)  # the first round's: it compiles
    assert rows["plain_train"]["cached_compile_s"] == pytest.approx(31.0)  # the later rounds load
    assert rows["peak_rss"]["ours_over_release"] == pytest.approx(0.625)  # 0.5 and 0.75
    lines = markdown.splitlines()
    assert (
        "| T²MLR train step (fwd + bwd + AdamW, 1 × 256 tokens) | 10.50 s | 3.75 s | 3.00× (2.00–4.00) "
        "| 30.0 s |" in lines
    )
    # decode: 64 tokens / 4 s release; ours median 1.5 s -> 42.7 tok/s
    assert (
        "| T²MLR greedy decode, batch 1, 16-token prompt + 64 new (tok/s) | 16.0 | 42.7 | 3.00× (2.00–4.00) "
        "| 30.0 s |" in lines
    )
    assert (
        "| peak memory of each whole run (RSS) | 4.00 GiB | 2.50 GiB | RSS 0.62× (compiling: 0.50×) |  |"
        in lines
    )
    # the whole run's time beside them, with our four programs' compile time in it
    assert (
        "| whole run (imports, builds, compiles, warm-ups, timed calls) | 100 s | 100 s (compiling: 100 s) "
        "| 1.00× | 120.0 s |" in lines
    )
    assert "136,175,042 / 136,175,042" in markdown
    assert "the later rounds load them from JAX's compilation cache (124.0 s for the four)" in markdown


@pytest.mark.parametrize("release", ["lrt", "ponderlm2"])
def test_writer_pages_of_the_other_releases(tmp_path, release):
    pair = vs_release.RELEASES[release]
    models = tuple(pair.ours.MODELS)
    runs = [
        run("release", 0, train_s=6.0, decode_s=4.0, rss=4 * 1024**3, models=models),
        run("ours", 0, train_s=3.0, decode_s=1.0, rss=2 * 1024**3, models=models),
    ]
    if release == "lrt":  # the LRT release runs on torch alone
        del runs[0]["versions"]["transformers"]
    spec = {
        **pair.ours.model_spec(),
        "train": pair.ours.TRAIN,
        "decode": {**pair.ours.DECODE, "new_tokens": 64},
    }
    meta = {
        "command": f"python -m experiments.vs_release --release={release}",
        "release": release,
        "preset": pair.ours.CONFIG,
        "spec": spec,
        "rounds": 1,
        "repeats": 2,
        "threads": 2,
        "release_src": release,
        "release_commit": "e0d0f6e",
        "versions": {side: runs[i]["versions"] for i, side in enumerate(("release", "ours"))},
    }
    markdown = vs_release.write_results(tmp_path, meta, runs)
    summary = json.loads((tmp_path / "results.json").read_text())["summary"]
    assert set(summary) == {*pair.programs, "peak_rss", "wall"}
    assert summary[f"{models[0]}_train"]["speed_ratio"] == pytest.approx(2.0)  # medians 9 / 4.5
    lines = markdown.splitlines()
    assert lines[0] == f"# {pair.ours.TITLE}"
    label = pair.ours.MODELS[models[0]]
    assert any(
        line.startswith(f"| {label} train step (fwd + bwd + ") and "| 9.00 s | 4.50 s | 2.00× |" in line
        for line in lines
    )
    assert any(
        line.startswith(f"| {label} greedy decode, batch 1, 16-token prompt + 64 new") for line in lines
    )
    assert f"{label} 136,175,042 / 136,175,042" in markdown
    assert ("transformers" in markdown) == (release == "ponderlm2")


def test_our_side_shares_one_compilation_cache_between_rounds(tmp_path, monkeypatch):
    """Each side's process gets JAX's compilation cache in --out: the first round compiles into it (it is
    emptied first), the later rounds load from it."""
    seen = []

    def fake_run(command, env, **kwargs):
        seen.append(env)
        return subprocess.CompletedProcess(command, 0, stdout=json.dumps({"side": "ours"}) + "\n", stderr="")

    monkeypatch.setattr(vs_release.subprocess, "run", fake_run)
    spec = {"compilation_cache": str(tmp_path / "jax_cache")}
    vs_release.run_side(vs_release.RELEASES["lrt"], "ours", sys.executable, spec)
    assert seen[0]["JAX_ENABLE_COMPILATION_CACHE"] == "true"
    assert seen[0]["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "jax_cache")
