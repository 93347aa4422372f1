"""A researcher's whole day on a tiny T²MLR model, as the README's Interop section writes it: train ->
evaluate the workdir -> export to HF and to the authors' layout (both verified) -> plain transformers loads
the HF folder in a fresh process and generates until EOS -> fine-tune from the export -> summarise the run.

The model memorises one short sentence (EOS after it), so "generates until EOS" is a real stop, not a
token budget running out."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

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
    "--config.optimizer.lr=1e-2",
    "--config.optimizer.warmup_ratio=0",
    "--config.eval.num_examples=4",
    "--config.train.progress=False",
]

pytestmark = pytest.mark.xdist_group("workflow")


def run(*args, cache):
    env = {
        **{k: v for k, v in os.environ.items() if k != "XLA_FLAGS"},  # one device, as a user's laptop
        "JAX_COMPILATION_CACHE_DIR": str(cache),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    }
    out = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=600, cwd=ROOT, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.fixture(scope="module")
def day(tmp_path_factory):
    """Every command of the walk, run once; the tests below check what each left behind."""
    root = tmp_path_factory.mktemp("day")
    text = root / "sentences.jsonl"
    text.write_text("".join(json.dumps({"text": SENTENCE}) + "\n" for _ in range(64)))
    data = [f"--config.data.train_path={text}", f"--config.data.eval_path={text}"]
    cache, workdir = root / "jax_cache", root / "run"
    main = lambda *a: run("main.py", f"--config={CONFIG}", *TINY, *data, *a, cache=cache)
    convert = lambda *a: run("tools/convert_checkpoint.py", *a, cache=cache)
    out = {
        "train": main("--config.train.steps=40", f"--workdir={workdir}"),
        "eval": main("--config.train.steps=40", f"--workdir={workdir}", "--mode=eval"),
        "eval_init_from": main(
            "--config.train.steps=40",
            "--mode=eval",
            f"--config.init_from={workdir}",
            f"--workdir={root / 'ev'}",
        ),
        "hf": convert(
            "--from",
            "orbax",
            "--to",
            "hf",
            str(workdir),
            str(root / "hf"),
            "--drop-recurrence",
            "--verify-text",
            str(text),
        ),
        "release": convert(
            "--from", "orbax", "--to", "t2mlr-torch", str(workdir), str(root / "release"), "--verify"
        ),
        "finetune": main(
            "--config.train.steps=2",
            f"--config.init_from={root / 'release'}",
            f"--workdir={root / 'finetuned'}",
        ),
        "report": run("tools/report.py", str(workdir), cache=cache),
    }
    return root, workdir, out


def test_eval_reads_the_workdir_and_reports_text_metrics(day):
    _, workdir, out = day
    assert "step 40" in out["eval"] and "perplexity" in out["eval"] and "exact match" not in out["eval"]
    metrics = json.loads((workdir / "eval_step40.json").read_text())
    assert metrics["loss"] < 1.0  # the sentence is memorised


def test_a_workdir_is_an_init_from_checkpoint(day):
    root, workdir, out = day
    assert f"init_from {workdir}" in out["eval_init_from"]
    assert not (root / "ev" / "checkpoints").exists()  # evaluation writes results, never checkpoints
    from_workdir = json.loads((root / "ev" / "eval_step0.json").read_text())
    assert from_workdir["loss"] == json.loads((workdir / "eval_step40.json").read_text())["loss"]


def test_the_hf_export_verifies_on_random_and_real_tokens(day):
    root, _, _ = day
    report = json.loads((root / "hf.verify.json").read_text())
    assert report["passed"] and report["text"]["passed"]
    assert {"tokenizer.json", "generation_config.json", "README.md"} <= {
        p.name for p in (root / "hf").iterdir()
    }


def test_the_release_export_verifies_and_fine_tunes(day):
    root, _, out = day
    assert "ok" in out["release"]
    assert json.loads((root / "release.verify.json").read_text())["passed"]
    assert (root / "release" / "README.md").exists()
    summary = json.loads((root / "finetuned" / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["eval"]["loss"] < 1.5  # started from the trained weights


def test_plain_transformers_generates_until_eos(day):
    root, _, _ = day
    script = textwrap.dedent(
        f"""
        import json, sys
        from transformers import AutoModelForCausalLM, AutoTokenizer
        tok = AutoTokenizer.from_pretrained({str(root / "hf")!r})
        model = AutoModelForCausalLM.from_pretrained({str(root / "hf")!r})
        prompt = tok("The cat", return_tensors="pt")
        out = model.generate(**prompt, max_new_tokens=40, do_sample=False)[0, prompt.input_ids.shape[1]:]
        print(json.dumps({{"ids": out.tolist(), "eos": tok.eos_token_id, "text": tok.decode(out)}}))
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    generated = json.loads(result.stdout.strip().splitlines()[-1])
    assert generated["ids"][-1] == generated["eos"] and len(generated["ids"]) < 40, generated
    assert generated["text"].startswith(" sat on the mat.")


def test_the_report_summarises_the_run(day):
    root, workdir, out = day
    assert (workdir / "report" / "curves.png").stat().st_size > 0
    assert json.loads((workdir / "report" / "report.json").read_text())
