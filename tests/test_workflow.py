"""A researcher's whole day on a tiny T²MLR model, as docs/interop.md writes it: train ->
evaluate the workdir -> evaluate it as another run's init_from -> export to HF and to the authors' layout
(both verified) -> plain transformers loads the HF folder in a fresh process and generates until EOS ->
fine-tune from the export -> summarise the run.

One test, one walk: every step reads what the one before wrote. The model memorises one short sentence
(EOS after it), so "generates until EOS" is a real stop, not a token budget running out."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.train.test_lm_eval import write_local_tasks
from tests.xla_flags import with_devices

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "smollm135m_t2mlr.py") + ":cpu"
SENTENCE = "The cat sat on the mat."
TINY = [
    "--config.model.num_layers=2",
    "--config.model.recurrence.l_start=0",
    "--config.model.recurrence.l_end=1",
    "--config.model.recurrence.d_forward=2",
    "--config.model.recurrence.d_backward=1",
    "--config.data.seq_len=32",
    "--config.train.batch_size=4",
    "--config.train.steps=40",
    "--config.optimizer.lr=1e-2",
    "--config.optimizer.warmup_ratio=0",
    "--config.eval.num_examples=4",
    "--config.train.progress=False",
]
GENERATE = """
import json
from transformers import AutoModelForCausalLM, AutoTokenizer
tok = AutoTokenizer.from_pretrained({folder!r})
model = AutoModelForCausalLM.from_pretrained({folder!r})
prompt = tok("The cat", return_tensors="pt")
out = model.generate(**prompt, max_new_tokens=40, do_sample=False)[0, prompt.input_ids.shape[1]:]
print(json.dumps({{"ids": out.tolist(), "eos": tok.eos_token_id, "text": tok.decode(out)}}))
"""


def run(*args, cache):
    env = {
        **os.environ,
        "XLA_FLAGS": with_devices(1),  # one device, as a user's laptop
        "JAX_COMPILATION_CACHE_DIR": str(cache),  # the fine-tune reuses the training run's compilations
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    }
    out = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=600, cwd=ROOT, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_a_researchers_day(tmp_path):
    text = tmp_path / "sentences.jsonl"
    text.write_text("".join(json.dumps({"text": SENTENCE}) + "\n" for _ in range(64)))
    data = [f"--config.data.train_path={text}", f"--config.data.eval_path={text}"]
    cache, workdir = tmp_path / "jax_cache", tmp_path / "run"
    main = lambda *a: run("main.py", f"--config={CONFIG}", *TINY, *data, *a, cache=cache)
    convert = lambda *a: run("tools/convert_checkpoint.py", "--from", "orbax", *a, cache=cache)

    main(f"--workdir={workdir}")
    out = main(f"--workdir={workdir}", "--mode=eval")
    assert "step 40" in out and "perplexity" in out and "exact match" not in out
    trained = json.loads((workdir / "eval_step40.json").read_text())
    assert trained["loss"] < 1.0  # the sentence is memorised

    # The workdir is a checkpoint: another run evaluates it, writing results and never checkpoints, and
    # runs lm-evaluation-harness tasks on it (two local ones: a multiple-choice and a perplexity task).
    tasks = write_local_tasks(tmp_path / "tasks")
    benchmarks = [
        "--config.eval.lm_eval_tasks=tiny_mc,tiny_text",
        f"--config.eval.lm_eval_include_path={tasks}",
    ]
    out = main(f"--workdir={tmp_path / 'ev'}", "--mode=eval", f"--config.init_from={workdir}", *benchmarks)
    assert f"init_from {workdir}" in out and not (tmp_path / "ev" / "checkpoints").exists()
    evaluated = json.loads((tmp_path / "ev" / "eval_step0.json").read_text())
    assert evaluated["loss"] == trained["loss"]
    assert 0 <= evaluated["lm_eval"]["tiny_mc"]["acc,none"] <= 1 and "tiny_mc" in out
    assert evaluated["lm_eval"]["tiny_text"]["word_perplexity,none"] > 1

    hf, release = tmp_path / "hf", tmp_path / "release"
    convert("--to", "hf", str(workdir), str(hf), "--drop-recurrence", "--verify-text", str(text))
    report = json.loads((tmp_path / "hf.verify.json").read_text())
    assert report["passed"] and report["text"]["passed"]
    assert {"tokenizer.json", "generation_config.json", "README.md"} <= {p.name for p in hf.iterdir()}
    assert "ok" in convert(
        "--to", "t2mlr-torch", str(workdir / "checkpoints" / "40"), str(release), "--verify"
    )
    assert json.loads((tmp_path / "release.verify.json").read_text())["passed"]
    assert (release / "README.md").exists()

    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(GENERATE.format(folder=str(hf)))],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    generated = json.loads(result.stdout.strip().splitlines()[-1])
    assert generated["ids"][-1] == generated["eos"] and len(generated["ids"]) < 40, generated
    assert generated["text"].startswith(" sat on the mat.")

    finetuned = tmp_path / "finetuned"
    main("--config.train.steps=2", f"--config.init_from={release}", f"--workdir={finetuned}")
    summary = json.loads((finetuned / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["eval"]["loss"] < 1.5  # started from the trained weights

    run("tools/report.py", str(workdir), cache=cache)
    assert (workdir / "report" / "curves.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((workdir / "report" / "report.json").read_text())
