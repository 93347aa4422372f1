"""tools/aot_compile.py as a user runs it (its own process: absl flags, like main.py's): a compile for a
v5e 2x2 written as aot.json / aot.md / the HLO; bad input one `error:` line, nothing written."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TINY = ("--config=configs/smollm135m_t2mlr.py:cpu", "--topology=v5e:2x2", "--batch=4", "--seq_len=128")


def aot_compile(*argv: str) -> subprocess.CompletedProcess:
    tool = [sys.executable, str(ROOT / "tools" / "aot_compile.py"), *argv]
    return subprocess.run(tool, cwd=ROOT, capture_output=True, text=True)


def test_a_decode_step_compiled_for_v5e_is_reported(tmp_path):
    done = aot_compile(*TINY, "--arch=transformer", "--mesh=fsdp:4", "--programs=decode", f"--out={tmp_path}")
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "aot.json").read_text())
    assert report["setting"]["chip"] == "TPU v5e" and report["setting"]["mesh"]["fsdp"] == 4
    (decode,) = report["programs"]
    assert decode["program"] == "decode" and decode["memory"]["fits"]
    assert 0 < decode["memory"]["total_bytes"] < decode["memory"]["hbm_bytes"]
    assert decode["collectives"]["all-gather"]["count"] > 0  # fsdp gathers the weights it decodes with
    assert decode["roofline"]["step_s"] > 0
    assert "| transformer | decode | 4 x TPU v5e |" in (tmp_path / "aot.md").read_text()
    assert (tmp_path / "hlo" / "transformer_decode.hlo.gz").stat().st_size > 0


@pytest.mark.parametrize(
    "argv, message",
    [
        (("--topology=v9z:2x2", "--mesh=fsdp:4"), "error: TPU topology 'v9z:2x2': "),
        (("--mesh=fsdp:3",), "error: --mesh='fsdp:3' on v5e:2x2 (4 chips): "),
        (("--mesh=fsdp:4", "--programs=train,sample"), "error: --programs: ['sample'] not among"),
        (("--mesh=fsdp:4", "--batch=2"), "batch_size 2 (per micro-batch 2) is not divisible"),
        (("--mesh=data:4", "--config.mesh.zero=2"), "error: mesh.zero must be one of (1, 3), got 2"),
    ],
)
def test_bad_input_is_one_line_before_anything_is_written(tmp_path, argv, message):
    done = aot_compile(*TINY, *argv, f"--out={tmp_path / 'out'}")
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1 and message in errors[0], done.stderr[-2000:]
    assert not (tmp_path / "out").exists()
