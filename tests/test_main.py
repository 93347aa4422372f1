"""main.py end to end, as a user runs it: --help, and a tiny comparison run followed by --mode=eval and
--mode=generate, the same run again reading every program it compiles from the persistent cache, a
foreign config and a changed optimizer refused on its workdir (the other bad inputs:
tests/faults/test_bad_input.py)."""

import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
S5 = os.path.join(ROOT, "configs", "s5_retrieval_t2mlr.py")
TINY = [
    "--config.model.hidden_size=32",
    "--config.model.num_layers=3",
    "--config.model.num_heads=2",
    "--config.model.num_kv_heads=2",
    "--config.model.mlp_dim=64",
    "--config.train.steps=2",
    "--config.train.log_every=1",
    "--config.train.batch_size=8",
    "--config.eval.num_examples=16",
    "--config.eval.batch_size=8",
    "--config.data.options.max_actions=3",
    "--config.data.eval_options.max_actions=4",
    "--config.data.seq_len=16",
    "--config.eval.window=20",
    "--config.t2mlr.forward_mode=jacobi",
    "--config.t2mlr.d_forward_values=1,2",  # a train step per sampled D
]


def main(*args, cache=None):
    env = {**os.environ, "JAX_LOG_COMPILES": "1", "JAX_EXPLAIN_CACHE_MISSES": "1"}
    if cache:
        env.update(JAX_COMPILATION_CACHE_DIR=cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "main.py"), *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env=env,
    )


@pytest.mark.slow
def test_help_lists_the_flags():
    out = main("--help")
    assert out.returncode == 0 and "Traceback" not in out.stderr
    for flag in ("--config", "--workdir", "--mode", "train|eval|generate"):
        assert flag in out.stdout


@pytest.mark.slow
def test_demo_shaped_run_then_eval_generate_and_a_foreign_workdir(tmp_path):
    workdir, cache = tmp_path / "demo", str(tmp_path / "jax_cache")
    out = main(f"--config={S5}:demo", *TINY, f"--workdir={workdir}", cache=cache)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Compiling" in out.stderr  # the log the bad-input tests check the absence of
    summary = json.loads((workdir / "summary.json").read_text())
    assert set(summary["runs"]) == {"t2mlr", "transformer"}
    assert summary["runs"]["transformer"]["num_params"] >= summary["runs"]["t2mlr"]["num_params"]
    assert set(summary["runs"]["t2mlr"]["by_length"]) == {"1", "2", "3", "4"}
    assert (workdir / "accuracy_vs_length.png").read_bytes()[:4] == b"\x89PNG"
    records = [json.loads(x) for x in (workdir / "t2mlr" / "metrics.jsonl").read_text().splitlines()]
    assert [r["split"] for r in records] == ["train", "train", "eval"]
    assert 0.0 < records[0]["gate/recurrent_gate"] < 1.0  # the constant-weight mixer's alpha
    assert list((workdir / "t2mlr" / "tensorboard").iterdir())

    out = main(f"--config={S5}:demo", *TINY, f"--workdir={workdir}", "--mode=eval", cache=cache)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads((workdir / "t2mlr" / "eval_step2.json").read_text())["examples"] == 16
    out = main(
        f"--config={S5}:demo",
        *TINY,
        f"--workdir={workdir}",
        "--mode=generate",
        "--num_generate=3",
        cache=cache,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = (workdir / "transformer" / "generations.jsonl").read_text().splitlines()
    assert len(lines) == 3 and {"input", "prediction", "target", "correct"} <= set(json.loads(lines[0]))

    # The same run again, in a new workdir: every program it compiles (the init, a train step per sampled
    # D, eval, generation) is read from the persistent cache, none compiled again.
    rerun = tmp_path / "rerun"
    hits = []
    for mode in ("train", "generate"):
        out = main(f"--config={S5}:demo", *TINY, f"--workdir={rerun}", f"--mode={mode}", cache=cache)
        assert out.returncode == 0, out.stderr[-3000:]
        assert "PERSISTENT COMPILATION CACHE MISS" not in out.stderr, out.stderr[-3000:]
        hits += re.findall(r"Persistent compilation cache hit for '(\w+)'", out.stderr)
    records = [json.loads(x) for x in (rerun / "t2mlr" / "metrics.jsonl").read_text().splitlines()]
    assert {r["d_forward"] for r in records if r["split"] == "train"} == {1, 2}
    assert hits.count("jit_step") >= 2 * 2 + 2  # two archs: T²MLR's two depths, the transformer, evals
    assert "jit_init_state" in hits, sorted(set(hits))

    before = sorted(str(p) for p in workdir.rglob("*"))
    for change, message in (
        ("--config.model.hidden_size=48", "holds a run of another config"),
        ("--config.optimizer.grad_clip=0", "optimizer.grad_clip: 1.0 -> 0.0"),
    ):
        out = main(f"--config={S5}:demo", *TINY, change, f"--workdir={workdir}")
        errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
        assert out.returncode == 2 and len(errors) == 1 and message in errors[0], out.stderr[-2000:]
        assert "Compiling" not in out.stderr
        assert sorted(str(p) for p in workdir.rglob("*")) == before


def test_a_run_stopped_by_sigterm_says_so_and_exits_75(monkeypatch, tmp_path, capsys):
    from types import SimpleNamespace

    import main as framework  # in-process, as tests.in_process does
    from t2mlr_jax.train import trainer

    monkeypatch.setattr(trainer, "train", lambda run: {"stopped_by": "SIGTERM", "step": 7})
    run = SimpleNamespace(num_params=1, workdir=tmp_path, mesh=SimpleNamespace(size=1), flops_per_step=None)
    with pytest.raises(SystemExit) as stopped:
        framework._train(None, tmp_path, {"t2mlr": run})
    assert stopped.value.code == framework.RESUMABLE == 75
    assert "t2mlr: stopped by SIGTERM at step 7, resumable" in capsys.readouterr().out


@pytest.mark.slow
def test_seeds_train_each_architecture_once_per_seed_in_workers_and_report_the_spread(tmp_path):
    workdir = tmp_path / "seeds"
    one_step = "--config.t2mlr.d_forward_values=1"  # one compiled train step per worker
    out = main(f"--config={S5}:cpu", *TINY, one_step, "--seeds=3,4", "--workers=2", f"--workdir={workdir}")
    assert out.returncode == 0, out.stderr[-3000:]
    for worker, seed in enumerate((3, 4)):  # worker I trains every 2nd run from the I-th
        config = json.loads((workdir / "t2mlr" / f"seed{seed}" / "run_config.json").read_text())
        assert config["seed"] == seed
        assert f"training t2mlr/seed{seed} " in (workdir / f"worker{worker}.log").read_text()
    assert "training t2mlr/seed" not in out.stdout  # the parent only compares
    assert re.search(r"t2mlr/seed3: \d+ params, .*exact match", out.stdout), out.stdout
    runs = json.loads((workdir / "summary.json").read_text())["runs"]
    assert list(runs) == ["t2mlr"] and sorted(runs["t2mlr"]["seeds"]) == ["3", "4"]
    assert set(runs["t2mlr"]["spread"]["exact_match"]) == {"mean", "std", "min", "max"}
    bad = main(f"--config={S5}:cpu", *TINY, "--seeds=1,x", f"--workdir={tmp_path / 'bad'}")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith("error: --seeds takes")
    bad = main(f"--config={S5}:cpu", "--mode=eval", "--workers=2", f"--workdir={workdir}")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1] == (
        "error: --workers and --shard are for --mode=train, not --mode=eval"
    )
