"""The configs reproduce one source each (issue 11): fine-tuning starts from a pretrained model, presets
give the release's recipe (default) or the paper's, the pretraining text layout is the release's, and
train.epochs counts steps as HF's num_train_epochs does. Config-level checks: nothing here compiles."""

import math
import os
import subprocess
import sys

import pytest

from configs.recipes import smollm2_tokenizer
from t2mlr_jax.config.edit import config_module
from t2mlr_jax.experiment import resolve
from t2mlr_jax.interop.pretrained import mismatches, pretrained_config
from t2mlr_jax.train.build_data import build_data_source
from t2mlr_jax.train.init_from import require_init_from
from t2mlr_jax.train.trainer import _steps_for_epochs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FINETUNING = ("gsm8k", "variable_assignment", "prosqa", "hotpotqa", "smollm2_retrofit")
PRETRAINING = ("smollm135m_t2mlr", "smollm360m_t2mlr", "smollm1b_t2mlr")


def config(name: str, preset: str = ""):
    return config_module(os.path.join(ROOT, "configs", f"{name}.py")).get_config(preset)


@pytest.fixture(scope="module")
def shipped_model():
    """The shipped GGUF's ModelConfig, read from its header as a run does."""
    return pretrained_config(smollm2_tokenizer())


@pytest.mark.slow
@pytest.mark.parametrize("name", FINETUNING)
def test_finetuning_needs_a_pretrained_model_and_cpu_brings_the_shipped_one(name, shipped_model):
    with pytest.raises(ValueError, match="init_from is required"):
        require_init_from(resolve(config(name)))
    cpu = config(name, "cpu")
    assert cpu.init_from == smollm2_tokenizer() != ""
    assert mismatches(shipped_model, resolve(cpu).model) == []  # the preset's model is the GGUF's
    # the release's fine-tuning scripts run without the temporal residual (their train_*.sh default), but
    # HotpotQA's release run is its sweep's, which turns it on (tests/test_release_recipes.py)
    assert config(name).model.recurrence.temporal_residual == (name == "hotpotqa")


def test_a_finetuning_run_without_init_from_stops_before_anything_is_written(tmp_path):
    gsm = os.path.join(ROOT, "configs", "gsm8k.py")
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "main.py"), f"--config={gsm}", f"--workdir={tmp_path / 'run'}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2 and out.stderr.strip().startswith("error: init_from is required")
    assert len(out.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()


def test_pretraining_and_s5_keep_the_temporal_residual():
    for name in (*PRETRAINING, "s5_retrieval_t2mlr"):
        assert config(name).model.recurrence.temporal_residual


@pytest.mark.parametrize(
    "name, preset, expected",
    [
        ("gsm8k", "", dict(lr=5e-4, b2=0.99, epochs=1.0, batch=256)),
        ("gsm8k", "paper", dict(lr=5e-5, b2=0.999, epochs=0.0, steps=8000, min_lr=0.0)),
        ("variable_assignment", "", dict(lr=5e-4, b2=0.99, epochs=1.0, batch=256, examples=200_000)),
        ("prosqa", "", dict(epochs=0.6, batch=128, examples=17_886)),
        ("hotpotqa", "", dict(lr=1e-4, b2=0.95, steps=5000, batch=64, wd=0.0)),
        ("hotpotqa", "paper", dict(b2=0.999, wd=0.01, steps=5000, batch=128)),
        ("s5_retrieval_t2mlr", "", dict(lr=5e-4, batch=16, steps=400_000, layers=6, rope=None)),
        ("s5_retrieval_t2mlr", "baseline", dict(arch="transformer", lr=5e-4, batch=16, rope=None)),
        ("s5_retrieval_t2mlr", "lstm", dict(arch="lstm", lr=5e-4, batch=16, steps=400_000)),
        ("s5_retrieval_t2mlr", "paper", dict(lr=1e-3, batch=64, steps=150_000, layers=4)),
        ("s5_retrieval_t2mlr", "paper_baseline", dict(arch="transformer", steps=400_000, rope=10_000.0)),
        ("smollm135m_t2mlr", "", dict(lr=6e-4, steps=10_000_000_000 // (256 * 2048), packing="concat")),
        ("smollm135m_t2mlr", "paper", dict(lr=5e-4, steps=20_000)),
        ("smollm135m_t2mlr", "baseline_compute_matched", dict(arch="transformer", steps=42_724)),
    ],
)
def test_presets_follow_one_source(name, preset, expected):
    c = config(name, preset)
    actual = dict(
        lr=c.optimizer.lr,
        b2=c.optimizer.adamw.b2,
        wd=c.optimizer.adamw.weight_decay,
        min_lr=c.optimizer.min_lr_ratio,
        epochs=c.train.epochs,
        steps=c.train.steps,
        batch=c.train.batch_size,
        examples=c.data.train_examples,
        layers=c.model.num_layers,
        rope=c.model.rope_theta,
        arch=c.arch,
        packing=c.data.packing,
    )
    assert {k: actual[k] for k in expected} == expected


def test_location_ablations_are_presets():
    for (a, b), (l_start, l_end) in {
        (1, 6): (0, 5),
        (25, 30): (24, 29),
        (1, 14): (0, 13),
        (17, 30): (16, 29),
    }.items():
        rec = config("smollm135m_t2mlr", f"w{a}_{b}").model.recurrence
        assert (rec.l_start, rec.l_end) == (l_start, l_end)


def test_epochs_count_steps_as_hf_does():
    assert _steps_for_epochs(resolve(config("variable_assignment")), 200_000).train.steps == 200_000 // 256
    prosqa = resolve(config("prosqa"))
    assert _steps_for_epochs(prosqa, 17_886).train.steps == math.ceil(0.6 * (17_886 // 128))
    with pytest.raises(ValueError, match="not counted; give train.steps"):
        _steps_for_epochs(resolve(config("smollm135m_t2mlr")), None)
    # a file's rows are counted: the GSM8K sample has 24
    gsm = config("gsm8k", "cpu")
    gsm.train.epochs = 1.0
    assert build_data_source(resolve(gsm)).train_examples == 24


def test_packing_fits_the_data_kind():
    assert config("smollm135m_t2mlr", "cpu").data.packing == "concat"  # the release's FineWeb layout
    assert config("lrt_nanochat").data.packing == "documents"
    assert config("variable_assignment").data.packing == "none"
    wrong = config("smollm135m_t2mlr", "cpu")
    wrong.data.packing = "none"
    with pytest.raises(ValueError, match=r"data.packing must be one of \('documents', 'concat'\)"):
        build_data_source(resolve(wrong))
