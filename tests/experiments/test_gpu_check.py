"""experiments/gpu_check.py and its shell wrapper: --help, one-line errors, the peak FLOP/s table, and the
dry run end to end (every part at tiny sizes on the CPU, each in its own process): the JSON's keys, and
every part with numbers for each case or, for cudnn on a CPU, the reason it was skipped."""

import json
import math
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from t2mlr_jax.studies.benchmarks import gpu_check

SCRIPT = gpu_check.ROOT / "experiments" / "gpu_check.sh"
# Per part, the numbers every measured case must have.
NUMBERS = {
    "env": (),
    "attention": ("fwd_ms", "fwd_bwd_ms"),
    "train": ("step_ms", "tokens_per_s", "flops_per_step", "tflops_per_s", "compile_s", "loss"),
    "decode": ("seconds", "baseline_seconds", "ratio", "tokens_per_s", "baseline_tokens_per_s"),
    "prefill": ("exact_seconds", "seconds", "speedup", "max_abs_logit_diff"),
}


def test_help_of_the_module_and_the_wrapper():
    for command in (
        [sys.executable, "-m", "experiments.gpu_check", "--help"],
        ["bash", str(SCRIPT), "--help"],
    ):
        done = subprocess.run(
            command,
            cwd=gpu_check.ROOT,
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHON": sys.executable},
        )
        assert done.returncode == 0, done.stderr
        for flag in ("--out", "--parts", "--budget_s", "--dry-run", "jax[cuda12]", "pip install -e ."):
            assert flag in done.stdout
    assert "Needs:" in done.stdout.split("usage:")[0]  # the wrapper's own header first


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--parts=train,speed"], "--parts: unknown ['speed']; choose from attention,train,decode,prefill"),
        (["--parts=,"], "--parts: unknown empty"),
        (["--budget_s=0"], "--budget_s must be > 0, got 0.0"),
    ],
)
def test_bad_arguments_are_one_line(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        gpu_check.main([*argv, f"--out={tmp_path / 'out'}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: " + message) and "\n" not in err
    assert not (tmp_path / "out").exists()


def test_every_part_has_a_share_a_table_and_a_runner():
    from t2mlr_jax.studies.benchmarks import gpu_parts

    assert list(gpu_check.SHARES) == list(gpu_parts.PARTS) == list(gpu_check.COLUMNS)
    assert sum(gpu_check.SHARES.values()) == pytest.approx(1.0)


def test_peak_flops_by_device_kind():
    """MFU's peak is the chip-facts table's (t2mlr_jax/parallel/chips.py), by jax's device_kind."""
    from t2mlr_jax.studies.benchmarks.throughput import default_peak_flops

    kind = lambda name, platform="gpu": SimpleNamespace(device_kind=name, platform=platform)
    assert (
        default_peak_flops(kind("NVIDIA H200"))
        == default_peak_flops(kind("NVIDIA H100 80GB HBM3"))
        == 989.4e12
    )
    assert default_peak_flops(kind("NVIDIA H100 PCIe")) == 756e12
    assert default_peak_flops(kind("TPU v5 lite", "tpu")) == 197e12
    assert default_peak_flops(kind("NVIDIA B300")) is None  # not in the table: MFU null
    assert default_peak_flops(kind("cpu", "cpu")) is None


def test_a_failing_unit_is_its_error_row_and_the_next_unit_runs(tmp_path, monkeypatch):
    from t2mlr_jax.studies.benchmarks import gpu_parts

    def broken():
        raise RuntimeError("cuDNN\nfailed")

    part = gpu_parts.Part(
        [("a", broken), ("b", lambda: [{"case": "b", "ms": 1.0}])], lambda rows: {"n": len(rows)}
    )
    monkeypatch.setitem(gpu_parts.PARTS, "train", lambda sizes: part)
    gpu_check.worker("train", "dry", tmp_path / "train.json", deadline=time.time() + 60)
    record = json.loads((tmp_path / "train.json").read_text())
    assert record == {
        "status": "partial",
        "cases": [{"case": "a", "error": "RuntimeError: cuDNN failed"}, {"case": "b", "ms": 1.0}],
        "summary": {"n": 2},
    }


def test_a_unit_without_time_left_is_skipped(tmp_path, monkeypatch):
    from t2mlr_jax.studies.benchmarks import gpu_parts

    def slow():
        time.sleep(0.3)
        return [{"case": "a", "ms": 1.0}]

    part = gpu_parts.Part([("a", slow), ("b", lambda: [{"case": "b", "ms": 1.0}])])
    monkeypatch.setitem(gpu_parts.PARTS, "train", lambda sizes: part)
    gpu_check.worker("train", "dry", tmp_path / "train.json", deadline=time.time() + 0.5)
    record = json.loads((tmp_path / "train.json").read_text())
    assert record["status"] == "ok" and record["cases"][0] == {"case": "a", "ms": 1.0}
    assert record["cases"][1]["case"] == "b"
    assert record["cases"][1]["skipped"].startswith(
        "not started: 0 s of the part's budget left, a unit took 0 s"
    )


def test_a_part_past_its_budget_is_stopped_and_recorded(tmp_path):
    args = SimpleNamespace(dry_run=True)
    record = gpu_check.run_part("env", args, tmp_path / "env.json", tmp_path / "env.log", budget_s=0.2)
    assert record["status"] == "timeout" and record["error"] == "stopped at its budget of 0 s"
    assert record["budget_s"] == 0.2 and record["wall_seconds"] < 5


@pytest.mark.parametrize(
    "record",
    [
        {
            "status": "crashed",
            "cases": [],
            "error": "exit status 1: ModuleNotFoundError: No module named 'jax'",
        },
        {
            "status": "partial",
            "cases": [{"case": "device", "error": "ModuleNotFoundError: No module named 'jax'"}],
        },
    ],
)
def test_a_jax_that_does_not_start_is_one_line(tmp_path, capsys, monkeypatch, record):
    def env_part(part, args, part_file, log, budget_s):
        log.write_text("Traceback ...\n")
        return {"budget_s": budget_s, "wall_seconds": 1.0, "log": str(log), **record}

    monkeypatch.setattr(gpu_check, "run_part", env_part)
    with pytest.raises(SystemExit) as exit_info:
        gpu_check.main([f"--out={tmp_path / 'out'}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: jax did not start: ") and err.endswith("No module named 'jax'")
    assert not (tmp_path / "out").exists()


def test_the_parts_that_run_share_the_budget():
    args = SimpleNamespace(budget_s=100.0, parts=["decode"])
    share = gpu_check.SHARES["decode"] / (gpu_check.SHARES["env"] + gpu_check.SHARES["decode"])
    assert gpu_check.budget_of("decode", args) == pytest.approx(100 * share)


@pytest.mark.slow
def test_without_a_gpu_it_stops_in_one_line_and_writes_nothing(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        gpu_check.main([f"--out={tmp_path / 'out'}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: jax runs on cpu (cpu), not a GPU: install jax with CUDA")
    assert "--dry-run" in err and "\n" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_dry_run_writes_every_part(tmp_path):
    payload = gpu_check.main(["--dry-run", f"--out={tmp_path}"])
    saved = json.loads((tmp_path / "gpu_check.json").read_text())
    assert saved == json.loads(json.dumps(payload))
    assert {"command", "dry_run", "device", "budget_s", "parts", "started_utc", "wall_seconds"} <= set(
        saved["meta"]
    )
    assert list(saved["parts"]) == list(gpu_check.SHARES)
    for name, part in saved["parts"].items():
        assert part["status"] == "ok", (name, part.get("error"), part["cases"])
        assert {"cases", "budget_s", "wall_seconds", "log"} <= set(part)
        assert part["cases"]
        for case in part["cases"]:
            assert "error" not in case, (name, case)
            if "skipped" in case:  # only a kernel of another platform
                assert (name, case["case"]) == ("attention", "cudnn")
                assert "needs a gpu backend, not cpu" in case["skipped"]
                continue
            for key in NUMBERS[name]:
                assert math.isfinite(case[key]) and case[key] >= 0, (name, case["case"], key)
    env = saved["parts"]["env"]["cases"][0]
    assert (
        env["platform"] == "cpu"
        and env["peak_flops"] is None
        and set(env["sizes"]) == {"model", *NUMBERS} - {"env"}
    )
    attention = {c["case"]: c for c in saved["parts"]["attention"]["cases"]}
    assert [c for c in attention if "skipped" not in attention[c]] == ["einsum", "xla"]
    assert saved["parts"]["attention"]["summary"]["all_within_tolerance"]
    train = saved["parts"]["train"]
    assert [c["case"] for c in train["cases"]] == ["transformer", "t2mlr (13,18)", "lrt P=1"]
    assert all(c["mfu"] is None for c in train["cases"])  # no peak on a CPU
    ratios = train["summary"]["over_transformer"]
    assert ratios["t2mlr (13,18)"]["flops"] > 1 and ratios["lrt P=1"]["flops"] > 1
    markdown = (tmp_path / "gpu_check.md").read_text()
    for name in gpu_check.SHARES:
        assert f"## {name}: ok" in markdown
    assert all((tmp_path / "logs" / f"{name}.log").exists() for name in gpu_check.SHARES)
