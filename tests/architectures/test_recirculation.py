"""Recirculation as architectures of the house: the adaptive variant trains its MLP through the trainer with
the pretrained base bitwise unchanged, and configs/recirculation.py:adaptive is the paper's recipe; the
training-free one scores and decodes through the contract (to the depth rule of tests/tolerance.py); bad
settings are one clear error when the architecture is built."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2mlr_jax.architectures import build_architecture
from t2mlr_jax.architectures.recirculation import decoding, settings
from t2mlr_jax.architectures.recirculation.forward import ADAPTIVE
from t2mlr_jax.config.edit import config_module
from t2mlr_jax.experiment import resolve
from t2mlr_jax.model.generate import teacher_forced
from t2mlr_jax.model.spec import is_spec
from t2mlr_jax.train.trainer import Run, restore_state, train
from tests.experiments import ROOT
from tests.tiny import score, tiny_experiment
from tests.tolerance import assert_fp32_close
from tests.train.tiny_task import tiny_batch, tiny_source

PATHWAY = {"source": 2, "destination": 0, "alpha": 0.3, "parallel_max_passes": 3}


def _config(arch, steps=2, **changes):
    return tiny_experiment(
        arch, steps=steps, checkpoint_every=2, sections={"recirculation": {**PATHWAY, **changes}}
    )


@pytest.mark.slow
def test_adaptive_mlp_trains_over_a_frozen_base(tmp_path):
    run = Run(resolve(_config("recirculation_adaptive")), tmp_path, tiny_source(), "recirculation_adaptive")
    start = run.fresh_state().params
    train(run)
    trained, step = restore_state(
        Run(resolve(_config("recirculation_adaptive")), tmp_path, tiny_source(), run.arch.name)
    )
    assert step == 2
    base = {k: v for k, v in trained.params.items() if k != ADAPTIVE}
    jax.tree.map(np.testing.assert_array_equal, base, {k: v for k, v in start.items() if k != ADAPTIVE})
    moved = jax.tree.map(lambda a, b: bool(jnp.any(a != b)), trained.params[ADAPTIVE], start[ADAPTIVE])
    assert moved["out"] == {"kernel": True, "bias": True}  # the zero-initialised last layer learns first


def test_adaptive_preset_is_the_papers_recipe():
    """100 steps, batch 32, AdamW 3e-4 with weight decay 1e-4 (constant LR); the MLP as wide as the model,
    the only trainable parameters."""
    config = config_module(ROOT / "configs" / "recirculation.py").get_config("adaptive")
    assert config.arch == "recirculation_adaptive"
    assert (config.train.steps, config.train.batch_size, config.train.grad_accum) == (100, 32, 1)
    o = config.optimizer
    recipe = (o.name, o.lr, o.adamw.weight_decay, o.schedule, o.warmup_ratio)
    assert recipe == ("adamw", 3e-4, 1e-4, "constant", 0)
    arch = build_architecture(resolve(_config("recirculation_adaptive")))
    d = arch.backbone.hidden_size
    mlp = arch.specs[ADAPTIVE]
    assert [mlp[k]["kernel"].shape for k in ("fc1", "fc2", "out")] == [(2 * d, d), (d, d), (d, 2 * d)]
    frozen = jax.tree.leaves(jax.tree.map(lambda s: s.frozen, arch.specs, is_leaf=is_spec))
    assert sum(frozen) == len(frozen) - 6  # every base weight frozen, the MLP's 3 kernels and 3 biases not


@pytest.mark.numerics
@pytest.mark.parametrize("stack", ["two", "single"])
def test_training_free_decodes_as_it_scores(stack):
    """The cached decoder, fed the scored tokens, gives the scoring's logits (fp32 round-off), and greedy
    decoding equals the argmax of teacher-forced scoring (at temperature 1.2)."""
    config = resolve(_config("recirculation", stack=stack, temperature=1.2))
    arch = build_architecture(config)
    params = arch.init(jax.random.PRNGKey(0))
    tokens = jnp.asarray(tiny_batch(0, 1, 2, 12)["tokens"])
    decoder, inputs = decoding(config, arch.backbone, settings(config, arch.backbone.num_layers))(params, {})
    decoded = teacher_forced(decoder, inputs, tokens, 4) / 1.2
    # blocks d+1..s once per token (the two-stack's first pass reads the earlier second passes' keys
    # there, the single stack carries block s into the next token), then the stack (and the two-stack's
    # own first pass)
    window, layers = PATHWAY["source"] - PATHWAY["destination"], arch.backbone.num_layers
    depth = tokens.shape[1] * window + layers + (window if stack == "two" else -window)
    assert_fp32_close(decoded, score(arch, params, tokens), depth, "decoded")
    prompt = tokens[:, :4]
    out = arch.generate(params, {}, prompt, jnp.ones_like(prompt), None, 3, None, 0)
    scored = score(arch, params, jnp.concatenate([prompt, out.tokens], axis=1))
    np.testing.assert_array_equal(jnp.argmax(scored[:, 3:-1], -1), out.tokens)


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(source=0, destination=0), "must be deeper"),
        (dict(source=3), "blocks 0..2"),
        (dict(alpha=1.2), r"\(0, 1\]"),
        (dict(scheme="slurp"), "scheme must be one of"),
        (dict(stack="triple"), "recirculation.stack must be one of"),
    ],
)
def test_bad_settings_fail_when_built(changes, message):
    with pytest.raises(ValueError, match=message):
        build_architecture(resolve(_config("recirculation", **changes)))
