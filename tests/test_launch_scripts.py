"""The launch scripts answer --help and refuse missing arguments with a one-line error."""

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*args, env=None):
    return subprocess.run(["bash", *args], cwd=ROOT, capture_output=True, text=True, env=env)


def test_tpu_pod_launcher_help_and_missing_arguments():
    assert "usage:" in run("tools/launch_tpu_pod.sh", "--help").stdout
    missing = run("tools/launch_tpu_pod.sh", "--tpu", "pod")
    assert missing.returncode == 2 and "--zone is required" in missing.stderr


def test_slurm_launcher_help():
    out = run("tools/launch_slurm.sbatch", "--help")
    assert out.returncode == 2 and "usage: sbatch" in out.stdout


def test_slurm_launcher_needs_the_checkout_not_a_venv_in_the_submit_directory():
    out = run(
        "tools/launch_slurm.sbatch",
        "cfg.py",
        "runs/x",
        env={"PATH": "/usr/bin:/bin", "T2MLR_ROOT": "/nowhere"},
    )
    assert out.returncode == 2 and out.stderr.startswith("error: no main.py in /nowhere")
