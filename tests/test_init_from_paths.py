"""config.init_from on what a researcher has at hand, nothing trained in this run: a training step folder
(WORKDIR/checkpoints/N, written by the trainer's own checkpointer), that run's workdir (its newest step),
and the HF folder tools/convert_checkpoint.py exports from the step; and main.py --mode=generate directly
on the HF export, which writes generations.jsonl and no checkpoints/ folder.

One tiny T²MLR text model (the SmolLM2 vocabulary, 2 layers of width 64) serves every test; its state is
drawn with numpy, so nothing is trained or initialised under XLA."""

import json
from pathlib import Path

import jax
import numpy as np
import pytest
from absl import flags

from t2mlr_jax.architectures import build_architecture
from t2mlr_jax.config.edit import config_module, set_path
from t2mlr_jax.experiment import resolve
from t2mlr_jax.train import init_from
from t2mlr_jax.train.build_data import build_data_source
from t2mlr_jax.train.trainer import Run
from tests.in_process import run_main, run_tool

flags.FLAGS.mark_as_parsed()  # grain reads absl flags

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "smollm135m_t2mlr.py"
STEP = 3
TINY = {
    "model.num_layers": 2,
    "model.recurrence.l_start": 0,
    "model.recurrence.l_end": 1,
    "model.recurrence.d_forward": 2,
    "model.recurrence.d_backward": 1,
    "data.seq_len": 32,
    "train.batch_size": 8,  # divisible by the tests' 8 CPU devices
    "eval.batch_size": 8,
    "eval.num_examples": 8,
    "eval.max_new_tokens": 4,
}


def tiny_config(**changes):
    config = config_module(CONFIG).get_config("cpu")
    for path, value in {**TINY, **changes}.items():
        set_path(config, path, value)
    return config


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(workdir, step folder, HF export, the stored state's params): a step written by the trainer's
    checkpointer with a trained-looking state (random weights, γ = 0.25), exported with --drop-recurrence."""
    tmp = tmp_path_factory.mktemp("init_from")
    config = tiny_config()
    typed = resolve(config)
    run = Run(typed, tmp / "run", build_data_source(typed, train=False), "t2mlr")
    rng = np.random.default_rng(0)

    def draw(path, leaf):
        name = jax.tree_util.keystr(path)
        if "gamma" in name:
            return np.full(leaf.shape, 0.25, leaf.dtype)
        if leaf.dtype == np.float32 and ".params" in name:
            return rng.normal(0.0, 0.1, leaf.shape).astype(leaf.dtype)
        return np.zeros(leaf.shape, leaf.dtype)  # step, optimizer moments, rng

    state = jax.tree_util.tree_map_with_path(draw, jax.eval_shape(run.programs.init_state))
    checkpointer = run.checkpointer()
    checkpointer.save(STEP, state, {}, force=True)
    checkpointer.close()
    step = tmp / "run" / "checkpoints" / str(STEP)
    export = ("--from", "orbax", "--to", "hf", step, tmp / "hf", "--drop-recurrence")
    assert run_tool(ROOT / "tools" / "convert_checkpoint.py", *export) == 0
    return tmp / "run", step, tmp / "hf", state.params


@pytest.mark.parametrize("kind", ["step folder", "workdir", "hf export"])
def test_init_from_reads_a_step_folder_its_workdir_and_its_hf_export(folders, kind):
    """The weights a fresh run starts from (what --mode=train/eval/generate load): the stored state's params
    exactly; the HF export holds the backbone alone, so its T²MLR run gets a fresh mixer."""
    workdir, step, hf, stored = folders
    config = tiny_config()
    config.init_from = str({"step folder": step, "workdir": workdir, "hf export": hf}[kind])
    typed = resolve(config)
    loaded = init_from.start_weights(typed, build_architecture(typed))()
    expected = {k: v for k, v in stored.items() if not (kind == "hf export" and k == "mixer")}
    assert jax.tree.structure(loaded) == jax.tree.structure(expected)
    for got, want in zip(jax.tree.leaves(loaded), jax.tree.leaves(expected)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.slow
def test_generate_on_init_from_writes_generations_and_no_checkpoints(folders, tmp_path, monkeypatch, capsys):
    hf, workdir = folders[2], tmp_path / "gen"
    run_main(
        f"--config={CONFIG}:cpu",
        *(f"--config.{k}={v}" for k, v in TINY.items()),
        f"--config.init_from={hf}",
        "--mode=generate",
        "--num_generate=2",
        f"--workdir={workdir}",
        monkeypatch=monkeypatch,
    )
    assert f"t2mlr @ init_from {hf}: 2 examples" in capsys.readouterr().out
    assert sorted(p.name for p in workdir.iterdir()) == ["generations.jsonl"]  # no checkpoints/
    records = [json.loads(line) for line in (workdir / "generations.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all({"prompt", "prediction"} <= set(r) for r in records)
    assert records[0]["prompt"] and all(isinstance(r["prediction"], str) for r in records)
