"""configs/hotpotqa.py:release against what the release really runs (issue 29). The fixture is the
release's own reading of scripts/hotpotqa/train_hotpotqa.sh with its sweep's T²MLR run (bash evaluates the
script, the release's HfArgumentParser parses the command line, its T2MLRConfig keeps the settings, its
evaluation resolves the generation settings, its mixing module computes a probe); made by
experiments/release_args.py. Every release field with a counterpart in our config is compared here, the
T²MLR ones through our importer of the release's settings (t2mlr_jax.architectures.t2mlr.release_configs).
Config-level: nothing here compiles but the 4-wide mixer probe."""

import json
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2mlr_jax.architectures.t2mlr import recurrence_from_release, t2mlr_layout
from t2mlr_jax.architectures.t2mlr.fusion import fuse
from t2mlr_jax.config.edit import config_module
from t2mlr_jax.experiment import resolve
from t2mlr_jax.formats.tables import from_state_dict, to_state_dict
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.params import init_params
from tests.tolerance import assert_fp32_close

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests/fixtures/release_args_hotpotqa.json"
HOW = "python -m experiments.release_args --release_src=../T2MLR --release_python=../release_venv/bin/python"
# Release values we reproduce without a field of our own: ours is always this.
PREMISES = {
    ("T2MLRArguments", "connection_detach"): False,  # the gradient flows through R
    ("T2MLRArguments", "freeze_base_model"): False,
    ("T2MLRArguments", "use_recurrent_weight_curriculum"): False,
    ("DataArguments", "insert_pause_tokens"): False,
    ("DataArguments", "control_flow_split_answer"): False,
}


@pytest.fixture(scope="module")
def release() -> dict:
    return json.loads(FIXTURE.read_text())


@pytest.fixture(scope="module")
def ours():
    return config_module(os.path.join(ROOT, "configs", "hotpotqa.py")).get_config()  # :release


def counterparts(release: dict) -> dict:
    """Our config fields (dotted) and the value the release's parsed arguments give each."""
    args, gen, gpus = release["args"], release["generation"], release["launch"]["num_gpus"]
    t, d, e, r = (
        args[k] for k in ("TrainingArguments", "DataArguments", "GenerationEvalArguments", "T2MLRArguments")
    )
    (preprocessing,) = d["custom_dataset_preprocessing"]
    return {
        "arch": "t2mlr" if r["t2mlr_enabled"] else "transformer",
        "init_from": None if args["ModelArguments"]["from_pretrained"] else "",  # None: a required path
        "seed": t["seed"],
        "model.dtype": "bfloat16" if t["bf16"] else "float32",
        "optimizer.name": {"adamw_torch_fused": "adamw", "adamw_torch": "adamw"}[t["optim"]],
        "optimizer.lr": t["learning_rate"],
        "optimizer.adamw.b1": t["adam_beta1"],
        "optimizer.adamw.b2": t["adam_beta2"],
        "optimizer.adamw.eps": t["adam_epsilon"],
        "optimizer.adamw.weight_decay": t["weight_decay"],
        "optimizer.grad_clip": t["max_grad_norm"],
        "optimizer.warmup_ratio": t["warmup_ratio"],
        "optimizer.schedule": {"cosine_with_min_lr": "cosine"}[t["lr_scheduler_type"]],
        "optimizer.min_lr_ratio": t["lr_scheduler_kwargs"]["min_lr_rate"],
        "optimizer.gate_lr_multiplier": r["gate_lr_multiplier"] or 1.0,
        # HF's Trainer: max_steps > 0 overrides num_train_epochs
        "train.steps": t["max_steps"],
        "train.epochs": 0.0 if t["max_steps"] > 0 else t["num_train_epochs"],
        "train.batch_size": t["per_device_train_batch_size"] * t["gradient_accumulation_steps"] * gpus,
        "train.log_every": t["logging_steps"],
        "train.eval_every": {"no": 0}[t["eval_strategy"]],  # evaluation once, after training
        "data.seq_len": d["max_length"],
        "data.all_recurrent": d["control_flow_all_recurrent"],
        "data.prompt_loss": not d["label_mask_prompt"],
        "data.format": {"hotpotqa_cot": "hotpotqa"}[preprocessing],
        "eval.generate": t["do_eval"],  # the release's evaluation is generation
        "eval.batch_size": t["per_device_eval_batch_size"] * gpus,
        # its budget is max(reference + target_length_buffer, default_new_tokens) per batch; ours is fixed
        "eval.max_new_tokens": e["max_new_tokens"] or e["default_new_tokens"],
        "eval.temperature": gen["temperature"] if gen["do_sample"] else 0.0,
        "eval.top_k": gen["top_k"] if gen["do_sample"] else 0,
        "eval.top_p": gen["top_p"] if gen["do_sample"] else 1.0,
        "t2mlr.forward_mode": "jacobi" if r["batch_forward"] else "exact",
        "t2mlr.eval_mode": "jacobi" if r["eval_batch_forward"] else "exact",
        "t2mlr.d_forward_values": r["batch_forward_approximate_depth_values"] or "",
    }


def value(config, dotted: str):
    for key in dotted.split("."):
        config = config[key]
    return config


def test_the_fixture_is_the_hotpotqa_sweep_run_of_the_release(release):
    launch = release["launch"]
    assert launch["script"] == "scripts/hotpotqa/train_hotpotqa.sh", f"remake it: {HOW}"
    assert launch["sweep_run"]["L_START"] == "1" and launch["num_gpus"] == 2
    # what the script's USE_GATE=True vs "on" comparison and its sampling evaluation come to
    assert release["t2mlr_settings"]["use_learnable_gate"] is False
    assert release["generation"]["do_sample"] and release["generation"]["num_generations_per_sample"] == 1


def test_release_preset_has_every_setting_the_release_runs(release, ours):
    expected = counterparts(release)
    assert {k: value(ours, k) for k in expected} == expected
    t = release["args"]["TrainingArguments"]
    assert ours.train.batch_size // ours.train.grad_accum == t["per_device_train_batch_size"]  # rows per pass
    for (section, name), premise in PREMISES.items():
        assert release["args"][section][name] == premise, (section, name)


def test_release_preset_has_the_recurrence_the_release_builds(release, ours):
    """Its T²MLR settings, as its config.json stores them, read by our importer: the whole
    RecurrenceConfig (window, Jacobi D and B, the gated mixer without learnable gates, the detached and
    rescaled temporal residual, gate inits)."""
    model = resolve(ours).model
    assert recurrence_from_release(release["t2mlr_settings"], model.hidden_size) == model.recurrence


@pytest.mark.numerics
def test_gated_fixed_computes_the_release_mixing_module(release):
    """The release's mixing module for these settings on the probe's inputs and weights (all random, both
    gammas nonzero): ours, given the same weights through the release layout, gives its output."""
    probe = release["mixer_probe"]
    x, big_r = (jnp.asarray(probe[k], jnp.float32) for k in ("x", "R"))
    rec = recurrence_from_release(release["t2mlr_settings"], x.shape[-1])
    assert rec.mixer == "gated_fixed"
    cfg = ModelConfig(
        vocab_size=8, hidden_size=4, num_layers=2 * rec.l_start + 2, num_heads=1, num_kv_heads=1, head_dim=4,
        mlp_dim=8, recurrence=rec,
    )  # fmt: skip
    layout = t2mlr_layout(cfg)
    state = to_state_dict(layout, init_params(cfg, jax.random.PRNGKey(0)))
    mixer = {k: k.split(".t2mlr_mixing_module.")[1] for k in state if ".t2mlr_mixing_module." in k}
    assert sorted(mixer.values()) == sorted(probe["weights"])
    state.update({k: np.asarray(probe["weights"][name], np.float32) for k, name in mixer.items()})
    params = from_state_dict(layout, state)["mixer"]
    out, stats = fuse(cfg, params, x, big_r, jnp.full(x.shape[:2], 2))
    assert_fp32_close(
        out, np.asarray(probe["out"]), 1, "the release's mixer output"
    )  # one fusion, two frameworks
    assert float(stats["recurrent_gate"].min()) == 1.0 and float(jnp.abs(stats["input_gate"]).max()) == 0.0
