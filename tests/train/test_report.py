"""tools/report.py: workdirs written by the real writers (run_config.json, MetricsLog) are summarized into
report.md / report.json / curves.png / gates.png; bad input is one `error:` line and nothing written."""

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from t2mlr_jax.config.convert import to_dict
from t2mlr_jax.experiment import resolve
from t2mlr_jax.storage.run_config import run_identity, write_run_config
from t2mlr_jax.storage.workdir import LOCK, SESSIONS, SUMMARY
from t2mlr_jax.train.metrics_log import MetricsLog
from tests.tiny import tiny_experiment

ROOT = Path(__file__).parents[2]
TOOL = ROOT / "tools" / "report.py"
GATES = {"gate/recurrent_gate": 0.5, "tanh_rezero_gamma_recurrent_gate": 0.01}


def load_tool():
    spec = importlib.util.spec_from_file_location("report_tool", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def logged_lines(gates: bool) -> list[tuple[float, int, str, dict]]:
    """(wall time, step, split, metrics) as the trainer logs them: 5 steps/s of 512 tokens after the first
    window (which includes compilation), the best eval loss at step 20 and not at the end."""

    def train(step):
        metrics = {
            "loss": 3 - step / 20,
            "accuracy": step / 100,
            "bpb": 2 - step / 50,
            "lr": 1e-3,
            "tokens": 512.0,
        }
        return {**metrics, **({k: v + step / 1000 for k, v in GATES.items()} if gates else {})}

    def evaluation(loss, accuracy):
        return {
            "loss": loss,
            "bpb": loss / 2,
            "token_accuracy": accuracy,
            "exact_match": 0.0,
            "by_length": {},
        }

    return [
        (1060.0, 10, "train", train(10)),
        (1062.0, 20, "train", train(20)),
        (1063.2, 20, "eval", evaluation(2.2, 0.30)),
        (1064.0, 30, "train", train(30)),
        (1065.0, 30, "eval", evaluation(2.4, 0.35)),
    ]


def write_run(workdir: Path, arch: str) -> None:
    write_run_config(workdir, {**run_identity(to_dict(resolve(tiny_experiment(arch)))), "arch": arch})
    clock = [0.0]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(time, "time", lambda: clock[0])
        with MetricsLog(workdir) as log:
            for at, step, split, metrics in logged_lines(gates=arch == "t2mlr"):
                clock[0] = at
                log.write(step, split, metrics)
    for step, size in ((10, 100), (30, 300)):
        (workdir / "checkpoints" / str(step) / "state").mkdir(parents=True)
        (workdir / "checkpoints" / str(step) / "state" / "d").write_bytes(b"x" * size)
    (workdir / "checkpoints" / "40.orbax-checkpoint-tmp-1").mkdir()  # an unfinished save is not listed
    (workdir / SUMMARY).write_text(json.dumps({"arch": arch, "num_params": 12345, "steps": 30}))


def is_png(path: Path) -> bool:
    data = path.read_bytes()
    return data.startswith(b"\x89PNG\r\n\x1a\n") and data.endswith(b"IEND\xaeB`\x82")


def test_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        load_tool().main(["--help"])
    assert exit_info.value.code == 0 and "python tools/report.py" in capsys.readouterr().out


def test_a_t2mlr_run_is_reported_as_logged(tmp_path):
    write_run(tmp_path, "t2mlr")
    out = subprocess.run(
        [sys.executable, str(TOOL), str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "12,345 params" in out.stdout and "5 steps/s, 2,560 tokens/s" in out.stdout

    report = json.loads((tmp_path / "report" / "report.json").read_text())
    (run,) = report["runs"]
    lines = logged_lines(gates=True)
    last_train = next(m for _, step, split, m in reversed(lines) if split == "train")
    assert run["name"] == "t2mlr" and run["config"] == json.loads((tmp_path / "run_config.json").read_text())
    assert run["train"]["final"] == {"step": 30, **last_train}
    assert run["eval"]["final"]["loss"] == 2.4 and run["eval"]["best"]["loss"] == {"value": 2.2, "step": 20}
    assert run["eval"]["best"]["token_accuracy"] == {"value": 0.35, "step": 30}
    assert run["train"]["best"]["loss"] == {"value": last_train["loss"], "step": 30}
    assert run["checkpoints"] == [
        {"step": 10, "bytes": 100, "latest": False},
        {"step": 30, "bytes": 300, "latest": True},
    ]
    assert (run["throughput"]["steps_per_second"], run["throughput"]["tokens_per_second"]) == (5.0, 2560.0)
    assert run["gate_keys"] == sorted(GATES)
    assert "| eval | loss | 2.4 | 2.2 (20) |" in (tmp_path / "report" / "report.md").read_text()
    assert is_png(tmp_path / "report" / "curves.png") and is_png(tmp_path / "report" / "gates.png")


def test_a_two_arch_workdir_gets_one_section_per_run(tmp_path):
    write_run(tmp_path / "t2mlr", "t2mlr")
    write_run(tmp_path / "transformer", "transformer")
    assert load_tool().main([str(tmp_path), "--out", str(tmp_path / "r")]) == 0
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert [r["name"] for r in report["runs"]] == ["t2mlr", "transformer"]
    assert [r["gate_keys"] for r in report["runs"]] == [sorted(GATES), []]
    markdown = (tmp_path / "r" / "report.md").read_text()
    assert "## t2mlr" in markdown and "## transformer" in markdown and "| transformer | " in markdown
    assert is_png(tmp_path / "r" / "curves.png") and is_png(tmp_path / "r" / "gates.png")


def test_an_old_log_without_time_and_gates(tmp_path, capsys):
    """A log from before lines carried `time`: throughput is unknown, and a run without gates has no
    gates.png."""
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "split": "train", "loss": 1.0 / s}) + "\n" for s in (1, 2, 3))
    )
    assert load_tool().main([str(tmp_path)]) == 0
    run = json.loads((tmp_path / "report" / "report.json").read_text())["runs"][0]
    assert run["throughput"]["steps_per_second"] == "unknown" and run["train"]["best"]["loss"]["step"] == 3
    assert not (tmp_path / "report" / "gates.png").exists()
    assert "gates.png skipped" in capsys.readouterr().out


def _bad_workdirs(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    (tmp_path / "file").write_text("")
    (tmp_path / "empty").mkdir()
    malformed = tmp_path / "malformed"
    malformed.mkdir()
    (malformed / "metrics.jsonl").write_text('{"step": 1, "split": "train", "loss": 1.0}\n{"step": 2, "spl\n')
    return {
        "not a directory": (tmp_path / "file", "is not a directory"),
        "missing": (tmp_path / "nope", "is not a directory"),
        "no runs": (tmp_path / "empty", "no metrics.jsonl and no sub-folder"),
        "malformed line": (malformed, "metrics.jsonl line 2: not valid JSON"),
    }


@pytest.mark.parametrize("case", ["not a directory", "missing", "no runs", "malformed line"])
def test_bad_input_is_one_error_line_and_nothing_written(case, tmp_path, capsys):
    workdir, message = _bad_workdirs(tmp_path)[case]
    before = sorted(tmp_path.rglob("*"))
    assert load_tool().main([str(workdir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
    assert sorted(tmp_path.rglob("*")) == before


# ---------------------------------------------------------------------------------------------
# How a run ended: workdirs written by hand as the trainer writes them (metrics.jsonl, sessions.jsonl).

HOST = socket.gethostname()
DEAD_PID = 2**22 + 1  # above Linux's pid_max: no such process


def dead_start(step: int, at: float) -> dict:
    return {"event": "start", "step": step, "time": at, "pid": DEAD_PID, "host": HOST}


def end(how: str, step: int, at: float) -> dict:
    return {"event": "end", "step": step, "time": at, "pid": DEAD_PID, "host": HOST, "how": how}


NAN_LINE = {"step": 32, "split": "nonfinite", "loss": "nan", "grad_norm": "inf", "skips": 1, "policy": "stop"}
ENDINGS = {  # case -> (sessions.jsonl lines, extra metrics.jsonl lines, how, what the line says)
    "finished": ([dead_start(0, 1000.0), end("finished", 30, 1070.0)], [], "finished", "finished at step 30"),
    "NaN stop": (
        [dead_start(0, 1000.0), end("nonfinite", 31, 1070.0)],
        [NAN_LINE],
        "nonfinite",
        "stopped at NaN: step 32 was non-finite (loss nan, gradient norm inf) and not applied; resumable "
        "from the checkpoint at step 30",
    ),
    "SIGTERM": (
        [dead_start(0, 1000.0), end("SIGTERM", 30, 1070.0)],
        [],
        "SIGTERM",
        "stopped by SIGTERM at step 30 after saving, resumable",
    ),
    "full disk": (
        [dead_start(0, 1000.0), end("no_space", 30, 1070.0)],
        [],
        "no_space",
        "stopped by a full disk, its last checkpoint at step 30; resumable once there is space",
    ),
    "killed": (
        [dead_start(0, 1000.0)],
        [],
        "killed",
        "killed (no end record in sessions.jsonl) after step 30; resumable from the checkpoint at step 30",
    ),
    "resumed twice": (
        [
            dead_start(0, 900.0),
            end("SIGTERM", 10, 950.0),
            dead_start(10, 960.0),  # killed: the next start comes first
            dead_start(10, 990.0),
            end("finished", 30, 1070.0),
        ],
        [],
        "finished",
        "finished at step 30; resumed 2 times (earlier sessions: SIGTERM, killed)",
    ),
    "old workdir, NaN stop": (None, [NAN_LINE], "nonfinite", "stopped at NaN: step 32 was non-finite"),
    "old workdir": (None, [], "unknown", "ending unknown (no sessions.jsonl: a run from before it)"),
}


def write_ending(workdir: Path, sessions: list[dict] | None, extra: list[dict]) -> None:
    """A 30-step run (checkpoints 10 and 30, summary.json written at time 1080) and its sessions."""
    write_run(workdir, "transformer")
    with open(workdir / "metrics.jsonl", "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in extra)
    if sessions is not None:
        (workdir / SESSIONS).write_text("".join(json.dumps(r) + "\n" for r in sessions))
    os.utime(workdir / SUMMARY, (1080.0, 1080.0))


def reported(workdir: Path, capsys) -> tuple[dict, list[str], str]:
    """(the run in report.json, its section of report.md, the printed summary)."""
    assert load_tool().main([str(workdir)]) == 0
    printed = capsys.readouterr().out
    (run,) = json.loads((workdir / "report" / "report.json").read_text())["runs"]
    markdown = (workdir / "report" / "report.md").read_text().splitlines()
    return run, markdown[markdown.index(f"## {run['name']}") + 2 :], printed


@pytest.mark.parametrize("case", ENDINGS)
def test_the_report_leads_with_how_the_run_ended(case, tmp_path, capsys):
    sessions, extra, how, text = ENDINGS[case]
    write_ending(tmp_path, sessions, extra)
    run, section, printed = reported(tmp_path, capsys)
    assert run["ending"]["how"] == how and run["ending"]["text"].startswith(text), run["ending"]
    assert section[0] == f"- **{run['ending']['text']}**"  # the section's first line
    assert f"\n  {run['ending']['text']}\n" in printed
    assert run["ending"]["resumes"] == (None if sessions is None else 2 if case == "resumed twice" else 0)
    if how == "nonfinite":
        assert run["ending"]["nonfinite"] == {**NAN_LINE}
    assert run["summary"] == {"arch": "transformer", "num_params": 12345, "steps": 30}


def test_a_summary_older_than_the_last_session_is_ignored(tmp_path, capsys):
    """A run resumed at 1100 and killed: the summary.json written at 1080 is the earlier session's."""
    write_ending(tmp_path, [dead_start(0, 1000.0), end("finished", 30, 1070.0), dead_start(30, 1100.0)], [])
    run, section, printed = reported(tmp_path, capsys)
    assert run["summary"] is None and run["ending"]["how"] == "killed"
    assert run["summary_note"].startswith("summary.json ignored: written ") and "earlier session's" in printed
    assert f"- {run['summary_note']}" in section and "12,345 params" not in printed


def test_a_session_holding_the_lock_is_running(tmp_path, capsys):
    """No end line, and train.lock names the session's process, alive on this host: still training."""
    start = {"event": "start", "step": 0, "time": 1000.0, "pid": os.getpid(), "host": HOST}
    write_ending(tmp_path, [start], [])
    (tmp_path / LOCK).write_text(json.dumps({"pid": os.getpid(), "host": HOST, "time": 1000.0}))
    run, _, _ = reported(tmp_path, capsys)
    assert run["ending"]["how"] == "running" and run["ending"]["text"].startswith("running (pid ")
