"""karpathy/nanochat's own GPT (92d63d4), number for number: a tiny random model its own code built, saved
and ran (tests/interop/fixtures/nanochat_release/, made by experiments/make_karpathy_nanochat_fixture.py)
imports as our `nanochat(variant="karpathy")` backbone with its logits, loss, every gradient and its cached
decode; each convention that differs from the LRT fork's is shown to matter; a perturbed weight fails the
check; an export writes its checkpoint back bitwise; our torch reference computes its logits."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from t2mlr_jax.formats.files import read_json
from t2mlr_jax.formats.nanochat import (
    from_nanochat_state,
    is_karpathy,
    model_config_from_nanochat,
    nanochat_gpt_config,
)
from t2mlr_jax.formats.nanochat_torch import NanochatReference
from t2mlr_jax.model import backbone
from t2mlr_jax.model.params import init_params
from t2mlr_jax.model.presets import nanochat
from t2mlr_jax.studies.parity import compare_states, path_layers
from tests.interop.helpers import (
    assert_planted_fails,
    assert_release_decode,
    assert_release_gradients,
    exported_nanochat,
    nanochat_release,
)
from tests.tolerance import assert_fp32_close

FIXTURE = Path(__file__).parent / "fixtures/nanochat_release"
RELEASE, META, STATE, TOKENS = nanochat_release(FIXTURE)
PREFILL = 4  # the fixture's cached decode: 4 tokens at once, then one at a time
LAYERS = 3  # every output's path: the 3 layers (parity.path_layers), 8 blocks of the depth rule
LRT_META = read_json(Path(__file__).parent / "fixtures/lrt_release_vanilla/model/meta_000000.json")


def test_the_checkpoint_reads_as_our_karpathy_nanochat_backbone(imported):
    cfg, _ = imported
    gpt = META["model_config"]
    assert is_karpathy(gpt) and not is_karpathy(LRT_META["model_config"])
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads) == (3, 32, 2, 1)
    assert (cfg.smear_channels, cfg.backout, cfg.backout_layer) == (24, True, 1)
    assert (cfg.gate_channels, cfg.ve_gate_scale, cfg.value_embed_layers) == (12, 3.0, (0, 2))
    assert (cfg.rope_theta, cfg.rope_table_dtype, cfg.layer_windows) == (
        100_000.0,
        "float32",
        (128, 128, None),
    )
    assert nanochat_gpt_config(cfg) == gpt


@pytest.mark.numerics
def test_logits_loss_and_every_gradient_match_the_release(imported):
    cfg, params = imported
    assert path_layers(cfg, params, TOKENS.shape[1])["logits"] == LAYERS
    assert_fp32_close(backbone.forward(cfg, params, TOKENS), RELEASE["logits"], LAYERS, "logits")
    assert_release_gradients(cfg, params, RELEASE, STATE, LAYERS)


@pytest.mark.numerics
def test_cached_decode_matches_the_releases(imported):
    """Its KVCache's prev_embedding is ours: the cache keeps each slot's token for the next one's smear."""
    assert_release_decode(*imported, RELEASE, PREFILL, LAYERS)


def _without(params, name):
    return {**params, name: jnp.zeros_like(params[name])}


CHANGES = {  # each: what the import would compute with one convention of the LRT fork's (or none)
    "perturbed weight": lambda cfg, p: (cfg, from_nanochat_state(cfg, _perturbed())),
    "no smear": lambda cfg, p: (cfg, _without(p, "smear_lambda")),
    "no backout": lambda cfg, p: (cfg, _without(p, "backout_lambda")),
    "gate 2 sigmoid": lambda cfg, p: (cfg.replace(ve_gate_scale=2.0), p),
    "q, k unscaled": lambda cfg, p: (cfg.replace(query_pre_attn_scalar=None), p),
    "rope base 10k": lambda cfg, p: (cfg.replace(rope_theta=10_000.0), p),
    "bfloat16 rope tables": lambda cfg, p: (cfg.replace(rope_table_dtype="bfloat16"), p),
    "no window": lambda cfg, p: (cfg.replace(window_pattern="L", sliding_window=None), p),
    "window 127": lambda cfg, p: (cfg.replace(sliding_window=127), p),
}


def _perturbed():
    key = "transformer.h.1.attn.c_k.weight"
    return {**STATE, key: STATE[key] + 1e-2}


@pytest.mark.numerics
@pytest.mark.parametrize("change", list(CHANGES))
def test_each_convention_is_what_matches(imported, change):
    """The check can fail: a weight moved by 1e-2, or any one of karpathy/nanochat's conventions replaced
    by the LRT fork's (or dropped), moves the logits past 1e-4, far past their bound (8.3e-6 here)."""
    cfg, params = CHANGES[change](*imported)
    assert_planted_fails(backbone.forward(cfg, params, TOKENS), RELEASE["logits"], LAYERS, 1e-4, change)


def test_an_older_karpathy_checkpoint_is_refused_by_name(imported):
    cfg, _ = imported
    older = {
        k: v for k, v in STATE.items() if k not in ("smear_gate.weight", "smear_lambda", "backout_lambda")
    }
    with pytest.raises(ValueError, match="karpathy/nanochat's GPT from before them"):
        from_nanochat_state(cfg, older)


def test_an_export_writes_the_releases_checkpoint_back(imported, tmp_path):
    cfg, params = imported
    written, meta = exported_nanochat(cfg, params, tmp_path / "back")
    same = compare_states(cfg.vocab_size, STATE, written)  # the vocabulary tables' real rows, bitwise
    assert same["bitwise"] and same["padded_rows_zero"], same
    assert sorted(written) == sorted(STATE)
    assert meta == META["model_config"] and model_config_from_nanochat(meta) == cfg


@pytest.mark.numerics
def test_our_torch_reference_computes_its_logits():
    """convert_checkpoint --verify's other side (nanochat_torch, written from the description): two torch
    fp32 evaluations of the model, held to the depth rule as ours is."""
    model = NanochatReference.from_checkpoint(FIXTURE / "model")
    with torch.no_grad():
        logits = model(torch.from_numpy(RELEASE["tokens"])).numpy()
    assert_fp32_close(logits, RELEASE["logits"], LAYERS, "torch reference")


def test_backout_refuses_a_block_range_that_skips_its_block(imported):
    cfg, params = imported
    h = backbone.embed(cfg, params, TOKENS)
    positions, segments = backbone.default_layout(TOKENS)
    with pytest.raises(ValueError, match="backout subtracts block 1's output"):
        backbone.run_blocks(cfg, params, h, 2, 3, positions=positions, segment_ids=segments, tokens=TOKENS)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"smear_channels": 64}, "smear_channels must be None or in"),
        ({"ve_gate_scale": 0.0}, "ve_gate_scale must be > 0"),
        ({"backout": True, "num_layers": 1}, "backout needs num_layers >= 2"),
    ],
)
def test_bad_options_are_one_line_errors(changes, message):
    with pytest.raises(ValueError, match=message):
        nanochat(2, width=32, head_dim=16, variant="karpathy").replace(**changes)
    with pytest.raises(ValueError, match="nanochat variant must be one of"):
        nanochat(2, variant="head")


def test_the_karpathy_preset_initialises_as_its_init_weights():
    """karpathy/nanochat's init_weights: λ_resid 1.15 -> 1.05 and λ_x0 0.2 -> 0.05 over the layers, λ_smear
    0, λ_backout 0.2, gates U(0, 0.02), embeddings N(0, 0.8), the MLP's up projection at 0.4 the bound."""
    cfg = nanochat(4, seq_len=256, width=64, head_dim=16, vocab_size=64, variant="karpathy")
    assert (cfg.mlp, cfg.mlp_dim) == ("relu2", 256)
    params = init_params(cfg, jax.random.PRNGKey(0))
    # Not an fp32 path: closed-form constants, each one rounding of a linspace (1e-6 relative is ~8 u)
    np.testing.assert_allclose(
        params["resid_lambdas"], [1.15, 1.15 - 0.1 / 3, 1.15 - 0.2 / 3, 1.05], rtol=1e-6
    )
    np.testing.assert_allclose(params["x0_lambdas"], [0.2, 0.15, 0.1, 0.05], rtol=1e-6)
    assert float(params["smear_lambda"][0]) == 0 and float(params["backout_lambda"][0]) == pytest.approx(0.2)
    for gate in (params["smear_gate"], params["layers"]["self_attn"]["ve_gate"]):
        assert 0 <= float(gate.min()) and float(gate.max()) <= 0.02
    bound = 3**0.5 * 64**-0.5
    assert float(jnp.abs(params["layers"]["mlp"]["up_proj"]).max()) <= 0.4 * bound
    assert float(jnp.abs(params["layers"]["self_attn"]["q_proj"]).max()) > 0.9 * bound
    assert float(params["embed_tokens"].std()) == pytest.approx(0.8, rel=0.05)


def test_the_driver_refuses_the_lrt_fork(tmp_path, capsys):
    """experiments/make_karpathy_nanochat_fixture.py: --help, and the LRT fork's checkout refused in one
    line before anything runs."""
    from t2mlr_jax.studies.fixtures import karpathy_nanochat as driver

    with pytest.raises(SystemExit) as done:
        driver.main(["--help"])
    assert done.value.code == 0 and "smear" in capsys.readouterr().out
    (tmp_path / "nanochat").mkdir()
    for name in ("gpt.py", "checkpoint_manager.py", "engine.py"):
        (tmp_path / "nanochat" / name).write_text(
            "use_interleaved = smear_gate = 0\n" if name == "gpt.py" else ""
        )
    with pytest.raises(SystemExit) as done:
        driver.main(["--release_src", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert (
        done.value.code == 2
        and "is not a checkout of karpathy/nanochat" in err
        and "has use_interleaved" in err
    )
