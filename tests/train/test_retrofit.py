"""config.init_from on the real SmolLM2-135M-Instruct GGUF: the retrofitted T²MLR model computes the
pretrained logits at step 0 (γ = 0), a checkpoint of another model or a bad init_from setting is one clear
error before anything compiles, and the :cpu preset of configs/smollm2_retrofit.py trains through main.py.
The in-process tests share one parse of the GGUF."""

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs.recipes import smollm2_tokenizer
from t2mlr_jax.architectures import build_architecture
from t2mlr_jax.config.edit import config_module
from t2mlr_jax.data.tokenizer import load_tokenizer
from t2mlr_jax.experiment import resolve
from t2mlr_jax.model import backbone
from t2mlr_jax.model.token_layout import make_layout
from t2mlr_jax.train import init_from
from t2mlr_jax.train.build_data import build_data_source
from t2mlr_jax.train.trainer import Run
from tests.tolerance import assert_fp32_close
from tests.xla_flags import DEVICE_COUNT, carried

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "smollm2_retrofit.py")
GGUF = smollm2_tokenizer()  # the model's GGUF, which also holds its tokenizer
# One xdist worker runs them in turn: the in-process 135M train state and the main.py run peak at ~7 GB each.
pytestmark = pytest.mark.xdist_group("smollm2_gguf")  # shares the GGUF parse (tests/conftest.py)
# main.py on one CPU device with XLA's optimisations: a batch of 1 does not split over the tests' 8 devices,
# and unoptimised, the 135M model's steps take minutes.
SENTENCE = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May."


def cpu_config():
    return config_module(CONFIG).get_config("cpu")


@pytest.fixture(scope="module")
def pretrained(smollm2_gguf):
    return smollm2_gguf


@pytest.fixture
def loaded_once(pretrained, monkeypatch):
    monkeypatch.setattr(init_from, "load_pretrained", lambda path, **kw: pretrained)
    return pretrained


@pytest.mark.slow
@pytest.mark.numerics
def test_retrofitted_model_is_the_pretrained_one_at_step_0(loaded_once, tmp_path):
    """The trainer's own initial state, sharded over the tests' 8 devices (fsdp)."""
    config = cpu_config()
    config.mesh.data, config.mesh.fsdp, config.train.batch_size = 1, 8, 8
    typed = resolve(config)
    run = Run(typed, tmp_path, build_data_source(typed), "t2mlr")
    sharded = run.restore_or_init(run.checkpointer())[0].params
    shards = {shard.data.size for shard in sharded["embed_tokens"].addressable_shards}
    assert shards == {sharded["embed_tokens"].size // 8}  # placed shard by shard, not replicated
    params = jax.device_get(sharded)  # run unsharded below: faster
    assert all(not v.any() for k, v in params["mixer"].items() if k.startswith("rezero_gamma"))
    tokens = jnp.asarray(load_tokenizer(GGUF).encode(SENTENCE))[None]
    recurrent = (
        jnp.full(tokens.shape, 2, jnp.int32).at[:, 0].set(1)
    )  # fusion on at every position but the first
    batch = make_layout(tokens, control_flow=recurrent)._asdict() | {"tokens": tokens}
    apply = jax.jit(lambda p, b: run.arch.apply(p, b, training=True, rng=None, model_state={}).logits)
    logits = apply(params, batch)
    reference = backbone.forward(*loaded_once, tokens)
    relative = float(jnp.abs(logits - reference).max() / jnp.abs(reference).max())
    print(
        f"retrofit at step 0: max |logit diff| / max |logit| = {relative:.1e} over {tokens.shape[1]} tokens"
    )
    # Every gamma 0: the fusion adds nothing, so both are the backbone's path through its layers.
    assert_fp32_close(logits, reference, loaded_once[0].num_layers, "retrofit at step 0")


def _bad(config, case):
    if case == "another model":
        config.model.num_layers, config.model.mlp_dim = 24, 1024
    elif case == "missing file":
        config.init_from = "/no/such/model.gguf"
    elif case == "required":
        config.init_from = None
    else:  # a widened baseline cannot hold the pretrained weights
        config.arch, config.baseline.param_match = "transformer", True
    return config


@pytest.mark.slow
@pytest.mark.parametrize(
    "case, error, message",
    [
        (
            "another model",
            ValueError,
            "2 differing fields: num_layers: 30 (checkpoint) vs 24 (config); mlp_dim",
        ),
        ("missing file", FileNotFoundError, "does not exist"),
        ("required", ValueError, "init_from is required"),
        ("param_match", ValueError, "param_match=False"),
    ],
)
def test_bad_init_from_is_one_clear_error_before_compiling(loaded_once, caplog, case, error, message):
    with jax.log_compiles(), caplog.at_level(logging.DEBUG), pytest.raises(error, match=re.escape(message)):
        config = resolve(_bad(cpu_config(), case))
        init_from.start_weights(config, build_architecture(config))
    assert not [r for r in caplog.records if "Compiling" in r.getMessage()]


@pytest.mark.slow
def test_cpu_preset_trains_through_main(tmp_path):
    rows = Path(ROOT, "configs", "samples", "gsm8k_aug.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "eval.jsonl").write_text("".join(rows[:2]))
    workdir = tmp_path / "run"
    # The preset, made as small as it goes: 1 step of one row (no warmup: that step has the full LR; one
    # 1.3 GB checkpoint), 2 eval rows, no chat template (shorter rows).
    smallest = [
        "--config.train.steps=1",
        "--config.optimizer.warmup_ratio=0",
        "--config.train.batch_size=1",
        "--config.data.chat=False",
        "--config.data.seq_len=80",
        f"--config.data.eval_path={tmp_path / 'eval.jsonl'}",
        "--config.eval.batch_size=2",
        "--config.eval.generate=False",
    ]
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "main.py"),
            f"--config={CONFIG}:cpu",
            f"--workdir={workdir}",
            *smallest,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        # one device, XLA optimising as usual (a 135M step runs here)
        env={**os.environ, "XLA_FLAGS": " ".join([*carried(), f"{DEVICE_COUNT}=1"])},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["steps"] == 1 and summary["eval"]["examples"] == 2
    train = json.loads((workdir / "metrics.jsonl").read_text().splitlines()[0])
    assert (
        np.isfinite(train["loss"]) and 0 < abs(train["tanh_rezero_gamma_recurrent_gate"]) < 0.1
    )  # moved off 0
