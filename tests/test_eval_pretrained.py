"""--mode=eval of a pretrained model with nothing trained: main.py (run in this process) scores the shipped
SmolLM2-135M-Instruct GGUF (config.init_from) on a text file given only as data.eval_path, in
non-overlapping windows of eval.window tokens, and prints and writes loss, perplexity and bits per byte,
which are transformers' on the same windows (to the depth rule of tests/tolerance.py)."""

import functools
import json
import math
from pathlib import Path

import jax
import numpy as np
import pytest
import torch

from configs.recipes import shakespeare_split
from t2mlr_jax.config.edit import config_module, set_path
from t2mlr_jax.parallel.mesh import make_mesh
from t2mlr_jax.train import build_data, init_from, trainer
from tests.in_process import run_main
from tests.tolerance import assert_within, fp32_bound

build = build_data.build_data_source

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "recirculation.py"
WINDOW, WINDOWS = 64, 2


def _kept(kept: list, value):
    kept.append(value)
    return value


def test_eval_window_is_the_eval_rows_one_name():
    """The recirculation config's window is the paper's 1024, elsewhere 0 (= data.seq_len) as before; the
    eval rows' length has no second name."""
    config = config_module(CONFIG).get_config()
    assert config.eval.window == 1024 and "eval_seq_len" not in config.data
    set_path(config, "eval.window", 32)
    assert config.eval.window == 32
    assert config_module(CONFIG).get_config("cpu").eval.window == 256
    assert config_module(ROOT / "configs" / "smollm2_retrofit.py").get_config("cpu").eval.window == 0


@pytest.mark.slow
@pytest.mark.numerics
@pytest.mark.xdist_group("smollm2_gguf")  # shares the GGUF parses (tests/conftest.py)
def test_eval_mode_scores_a_gguf_with_only_eval_text_as_transformers(
    tmp_path, monkeypatch, capsys, smollm2_gguf, smollm2_transformers
):
    model, tokenizer = smollm2_transformers
    text = open(shakespeare_split()[1].split(",")[0]).read()[20_000:21_500]  # ~400 tokens: > 2 windows
    eval_file, workdir = tmp_path / "heldout.txt", tmp_path / "eval"
    eval_file.write_text(text)
    overrides = {
        "arch": "transformer",  # the unmodified model
        "data.train_path": "",  # evaluation needs only the eval text
        "data.eval_path": str(eval_file),
        "eval.window": WINDOW,
        "eval.batch_size": WINDOWS,
        "eval.num_examples": WINDOWS,
    }
    # The GGUF's config and weights as the session parsed them once (tests/conftest.py); one device, as on a
    # laptop (each of the 8 fake test devices would compute the whole batch); the data main.py scored.
    monkeypatch.setattr(init_from, "pretrained_config", lambda path, param_dtype: smollm2_gguf[0])
    monkeypatch.setattr(init_from, "load_pretrained", lambda path, param_dtype: smollm2_gguf)
    monkeypatch.setattr(trainer, "make_mesh", functools.partial(make_mesh, devices=jax.devices()[:1]))
    sources = []
    monkeypatch.setattr(build_data, "build_data_source", lambda *a, **k: _kept(sources, build(*a, **k)))
    run_main(
        f"--config={CONFIG}",
        "--mode=eval",
        f"--workdir={workdir}",
        *(f"--config.{k}={v}" for k, v in overrides.items()),
        monkeypatch=monkeypatch,
    )
    metrics = json.loads((workdir / "eval_step0.json").read_text())
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("transformer @ init_from")]
    for label, key in (("loss", "loss"), ("perplexity", "perplexity"), ("bits per byte", "bpb")):
        assert f"{label} {metrics[key]:.4g}" in line
    assert metrics["window"] == WINDOW and metrics["examples"] == WINDOWS
    assert f"over {WINDOWS} windows of {WINDOW} tokens" in line

    # The windows main.py scored: consecutive, non-overlapping, eval.window tokens each, every token
    # supervised by the next one of the text, positions restarting in each.
    (batch,) = list(sources[0].eval_batches())
    ids = np.asarray(tokenizer(text)["input_ids"][: WINDOWS * WINDOW + 1])
    np.testing.assert_array_equal(batch["tokens"], ids[:-1].reshape(WINDOWS, WINDOW))
    np.testing.assert_array_equal(batch["targets"], ids[1:].reshape(WINDOWS, WINDOW))
    assert np.all(batch["loss_mask"] == 1) and np.all(batch["segment_ids"] == 1)
    np.testing.assert_array_equal(batch["positions"], np.tile(np.arange(WINDOW), (WINDOWS, 1)))

    with torch.no_grad():
        logits = model(torch.as_tensor(batch["tokens"])).logits
        nll = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), torch.as_tensor(batch["targets"]).long().flatten(), reduction="sum"
        ).item()
    text_bytes = len(tokenizer.decode(ids[1:]).encode("utf-8"))  # the targets' text
    reference = {
        "loss": nll / ids[1:].size,
        "perplexity": math.exp(nll / ids[1:].size),
        "bpb": nll / (math.log(2.0) * text_bytes),
    }
    print(
        f"SmolLM2 GGUF --mode=eval: {metrics['perplexity']:.6f} vs transformers {reference['perplexity']:.6f}"
    )
    # One fp32 model in two frameworks: the mean NLL moves by at most 2 max |Δ logit| (log-softmax is
    # 1-Lipschitz in the max norm), the depth rule (tests/tolerance.py) over its layers at its largest logit;
    # the perplexity's log and bits per byte (relative to a mean NLL above 1) by no more.
    bound = 2 * fp32_bound(model.config.num_hidden_layers, float(logits.abs().max()))
    assert_within(abs(metrics["loss"] - reference["loss"]), bound, "loss")
    assert reference["loss"] > 1
    for key in ("perplexity", "bpb"):
        assert_within(abs(math.log(metrics[key] / reference[key])), bound, f"log {key}")
