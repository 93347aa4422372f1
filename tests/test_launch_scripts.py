"""The launch scripts answer --help and refuse missing arguments with a one-line error."""

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*args):
    return subprocess.run(["bash", *args], cwd=ROOT, capture_output=True, text=True)


def test_tpu_pod_launcher_help_and_missing_arguments():
    assert "usage:" in run("tools/launch_tpu_pod.sh", "--help").stdout
    missing = run("tools/launch_tpu_pod.sh", "--tpu", "pod")
    assert missing.returncode == 2 and "--zone is required" in missing.stderr


def test_slurm_launcher_help():
    out = run("tools/launch_slurm.sbatch", "--help")
    assert out.returncode == 2 and "usage: sbatch" in out.stdout
