"""The house takes a new variant without edits elsewhere: a toy architecture, defined and registered only
here (its own typed config section, whose typos and wrong values are one clear error; an extra parameter
with a spec, an aux loss, non-gradient state), trains two steps through the trainer, checkpoints, resumes
to the uninterrupted run (fp32 round-off), and generates with the backbone's KV cache; what else it can do
(eval.thoughts; its export mapping, by which interop writes its runs as an HF model with the same logits)
is read off the `Capabilities` it registers with."""

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from t2mlr_jax.architectures import (
    ARCHITECTURES,
    SYSTEMS_VARIABLE,
    Capabilities,
    build_architecture,
    import_systems,
    register_architecture,
)
from t2mlr_jax.architectures.recompute import greedy_by_recompute
from t2mlr_jax.config.convert import model_to_dict, to_dict
from t2mlr_jax.config.sections import SECTIONS
from t2mlr_jax.experiment import from_config_dict, resolve
from t2mlr_jax.interop.orbax_folder import load_config
from t2mlr_jax.model.token_layout import make_layout
from t2mlr_jax.storage import checkpoint as ckpt
from t2mlr_jax.train.trainer import Run, restore_state, train
from tests.in_process import run_tool
from tests.tiny import tiny_experiment
from tests.train.tiny_task import tiny_batch, tiny_source

TOY = "tests.toy_system"  # the system, kept outside the package
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def toy():
    importlib.import_module(TOY)  # registers "toy" and its section, as T2MLR_JAX_SYSTEMS would

    def config(steps: int, **toy):
        c = tiny_experiment(
            "toy", steps=steps, checkpoint_every=2, sections={"toy": {"scale_init": 0.7, **toy}}
        )
        c.model.rope_theta = 10_000.0  # with RoPE: HF Llama, which its export writes, has no NoPE variant
        return c

    yield config
    ARCHITECTURES.unregister("toy")
    SECTIONS.unregister("toy")
    sys.modules.pop(TOY)


def _tokens_seen(steps: int) -> float:
    return float(sum(tiny_batch(0, i, 8, 16)["loss_mask"].sum() for i in range(1, steps + 1)))


@pytest.mark.slow
def test_a_toy_architecture_trains_checkpoints_resumes_and_generates(tmp_path, toy):
    train(Run(resolve(toy(2)), tmp_path / "resumed", tiny_source(), "toy"))
    state, step = restore_state(Run(resolve(toy(2)), tmp_path / "resumed", tiny_source(), "toy"))
    assert step == 2 and float(state.model_state["tokens_seen"]) == _tokens_seen(2)
    assert float(state.params["embed_scale"][0]) != 0.7  # trained, from its own config section's init
    log = [json.loads(line) for line in (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()]
    assert any("aux/scale" in r for r in log)

    train(Run(resolve(toy(3)), tmp_path / "resumed", tiny_source(), "toy"))  # resumes at step 2
    train(Run(resolve(toy(3)), tmp_path / "straight", tiny_source(), "toy"))
    resumed, _ = restore_state(Run(resolve(toy(3)), tmp_path / "resumed", tiny_source(), "toy"))
    straight, _ = restore_state(Run(resolve(toy(3)), tmp_path / "straight", tiny_source(), "toy"))
    assert float(resumed.model_state["tokens_seen"]) == _tokens_seen(3)
    # Its first two steps ran in the 2-step config's program, which XLA may compile to other round-off
    # (the same-config resume is bitwise: tests/faults/test_kill.py): a rounding or two of each value.
    for a, b in zip(jax.tree.leaves(jax.device_get(resumed)), jax.tree.leaves(jax.device_get(straight))):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8)

    arch = build_architecture(resolve(toy(3)))
    prompt = jnp.asarray(tiny_batch(5, 1, 2, 6)["tokens"]).at[:, 0].set(1)
    mask = jnp.ones_like(prompt)
    cached = jax.jit(arch.generate, static_argnums=(5, 6, 7))(
        resumed.params, {}, prompt, mask, None, 4, None, 0
    )
    recomputed = greedy_by_recompute(
        lambda p, t, lay: arch.apply(
            p, {"tokens": t, "loss_mask": jnp.ones(t.shape), **lay._asdict()}, training=False, rng=None,
            model_state={},
        ).logits,
        resumed.params, prompt, mask, None, max_new_tokens=4, eos_id=None, pad_id=0,
    )  # fmt: skip
    np.testing.assert_array_equal(cached.tokens, recomputed.tokens)

    # Exported through its mapping as a plain HF Llama, whose logits in transformers are the toy's own.
    exported = tmp_path / "hf"
    tool = REPO / "tools" / "convert_checkpoint.py"
    assert run_tool(tool, "--from", "orbax", "--to", "hf", tmp_path / "resumed", exported) == 0
    torch_side = transformers.AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32)
    with torch.no_grad():
        theirs = torch_side(torch.tensor(np.asarray(prompt))).logits.numpy()
    batch = {"tokens": prompt, "loss_mask": mask, **make_layout(prompt)._asdict()}
    ours = arch.apply(resumed.params, batch, training=False, rng=None, model_state={}).logits
    np.testing.assert_allclose(theirs, np.asarray(ours), rtol=1e-4, atol=1e-4)


def test_its_settings_are_typed_and_checked_before_anything_is_built(toy):
    assert resolve(toy(2)).toy == sys.modules[TOY].ToySettings(scale_init=0.7)
    with pytest.raises(
        KeyError, match=r"toy.scale_int is not a config field \(did you mean 'scale_init'\?\)"
    ):
        toy(2, scale_int=0.7)
    with pytest.raises(TypeError, match=r"'scale_init'.*big"):  # ml_collections, at the edge
        toy(2, scale_init="big")
    stored = {**to_dict(resolve(toy(2))), "toy": {"scale_init": "big"}}  # e.g. a run_config.json read back
    with pytest.raises(ValueError, match=r"toy.scale_init must be float, got 'big'"):
        from_config_dict(stored)
    with pytest.raises(ValueError, match=r"toy.scale_init must be > 0, got -1.0"):
        resolve(toy(2, scale_init=-1.0))


def test_an_unknown_architecture_lists_the_registered_ones(toy):
    with pytest.raises(ValueError, match=r"unknown architecture 'toy2'; registered: .*lstm.*t2mlr.*toy"):
        build_architecture(resolve(toy(2)), "toy2")


@pytest.fixture
def capable_toy(toy):
    """The toy again, declaring both capabilities where it registers (and nothing else about them)."""
    capabilities = Capabilities(thought_slots=True)  # and no export mapping
    register_architecture("capable_toy", sys.modules[TOY].build, section="toy", capabilities=capabilities)
    yield
    ARCHITECTURES.unregister("capable_toy")


def test_eval_thoughts_need_the_thought_slots_capability(toy, capable_toy):
    config = toy(2)
    config.eval.thoughts = 1
    config = resolve(config)
    build_architecture(config, "capable_toy")
    with pytest.raises(
        ValueError,
        match=r"^eval.thoughts=1: architecture 'toy' has no latent thought slots \(those with them: "
        r"capable_toy, lrt, ponderlm2\)$",
    ):
        build_architecture(config, "toy")


def test_interop_reads_the_runs_of_an_architecture_with_an_export_mapping_only(
    toy, capable_toy, tmp_path, monkeypatch
):
    model = resolve(toy(2)).model.replace(recurrence=None)
    step = tmp_path / "checkpoints" / "2"  # a training step folder whose meta record names `arch`
    for item in ("state", "meta"):
        (step / item).mkdir(parents=True)

    def meta(arch: str):
        record = {"arch": arch, "model_config": model_to_dict(model)}
        monkeypatch.setattr(ckpt, "read_folder_metadata", lambda folder, name: record)

    meta("toy")
    assert load_config(step) == model
    meta("capable_toy")
    with pytest.raises(ValueError, match=r"only t2mlr and toy and transformer runs can be read"):
        load_config(step)


def test_main_help_names_a_system_found_outside_the_package():
    env = {**os.environ, SYSTEMS_VARIABLE: TOY}
    out = subprocess.run(
        [sys.executable, "main.py", "--help"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    listed = next(line for line in out.stdout.splitlines() if line.startswith("Architectures"))
    assert "toy" in listed.split(": ")[1].rstrip(".").split(", ")


def test_a_system_module_that_is_not_there_is_one_error(monkeypatch):
    monkeypatch.setenv(SYSTEMS_VARIABLE, "tests.no_such_system")
    with pytest.raises(ValueError, match=r"^T2MLR_JAX_SYSTEMS: no module 'tests.no_such_system' to import"):
        import_systems()
