"""HF Gemma3 text models (Gemma3ForCausalLM) as a config of our backbone: (1 + w) norms, scaled embeddings,
sandwich norms, GeGLU, QK-norm, query_pre_attn_scalar and sliding layers with their own RoPE base; logit
parity with transformers on tiny random models, and one clear error for what does not map."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, Gemma3TextConfig

from t2mlr_jax.formats.configs import model_config_from_hf
from t2mlr_jax.interop import load_pretrained, save_hf
from t2mlr_jax.model import backbone
from tests.interop.helpers import assert_planted_fails, tiny_gemma3_config, transformers_model
from tests.tolerance import assert_near_f64

TOKENS = np.random.default_rng(0).integers(0, 128, (2, 12))
SLIDING, FULL = "sliding_attention", "full_attention"
CASES = {
    # Sliding and full layers alternating (sliding window 4 << 12 tokens), tied embeddings.
    "windows": {},
    # Gemma3 1B's layout in small: every third layer full, the last two sliding.
    "last_sliding": {"layer_types": (SLIDING, SLIDING, FULL, SLIDING, SLIDING)},
    # Every layer full, untied head, final logit softcap.
    "global": {"layer_types": (FULL, FULL), "tie_word_embeddings": False, "final_logit_softcapping": 3.0},
}


@pytest.fixture(scope="module", params=list(CASES))
def gemma3(request, tmp_path_factory):
    """A random transformers Gemma3 (norm weights drawn, so (1 + w) matters) saved as an HF folder, its
    logits, and what we load from the folder."""
    folder = tmp_path_factory.mktemp("gemma3") / "hf"
    model = transformers_model(tiny_gemma3_config(**CASES[request.param]), seed=2)
    model.save_pretrained(folder)
    with torch.no_grad():
        logits = model(torch.as_tensor(TOKENS)).logits.numpy()
    cfg, params = load_pretrained(folder)
    return request.param, folder, logits, cfg, params


def test_config_maps_every_field(gemma3):
    case, _, _, cfg, _ = gemma3
    assert (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.mlp_dim) == (64, 4, 2, 16, 96)
    assert (cfg.norm_offset, cfg.embed_scale, cfg.sandwich_norms, cfg.qk_norm, cfg.mlp) == (
        True,
        True,
        True,
        "before_rope",
        "geglu",
    )
    assert (cfg.query_pre_attn_scalar, cfg.rope_theta, cfg.norm_eps) == (24.0, 20000.0, 1e-6)
    if case == "windows":
        assert (cfg.window_pattern, cfg.sliding_window, cfg.rope_local_theta) == ("SL", 3, 5000.0)
        assert cfg.layer_windows == (3, None, 3, None) and cfg.tie_embeddings and cfg.logit_softcap is None
        assert cfg.last_layer_full
    elif case == "last_sliding":
        assert (cfg.window_pattern, cfg.sliding_window, cfg.last_layer_full) == ("SSL", 3, False)
        assert cfg.layer_windows == (3, 3, None, 3, 3) and cfg.rope_local_theta == 5000.0
    else:
        assert (cfg.window_pattern, cfg.sliding_window, cfg.rope_local_theta) == ("L", None, None)
        assert not cfg.tie_embeddings and cfg.logit_softcap == 3.0


@pytest.mark.numerics
def test_logits_match_transformers(gemma3):
    """Within the float64 rule (tests/tolerance.py) of transformers' own forward run in float64: these
    random Gemmas' logits are small (max ~1.1-1.6) beside the sqrt(H)-scaled stream summed into them, so
    each fp32 path is ~10-13 u x max |logit| per layer from float64 (transformers' and ours alike), past
    the depth rule's per-block allowance; measured against transformers' own fp32 error instead."""
    _, folder, theirs, cfg, params = gemma3
    ours = np.asarray(backbone.forward(cfg, params, jnp.asarray(TOKENS)))
    print(f"relative max error {np.abs(ours - theirs).max() / np.abs(theirs).max():.2e}")
    exact = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64).eval()
    with torch.no_grad():
        exact = exact(torch.as_tensor(TOKENS)).logits.numpy()
    assert_near_f64(ours, theirs, exact, cfg.num_layers, "logits")


@pytest.mark.numerics
def test_each_option_matters(gemma3):
    """Switching off any Gemma option moves the logits (1e-3 of the largest, past their bound): the parity
    above exercises all of them."""
    case, _, theirs, cfg, params = gemma3
    changes = [{"norm_offset": False}, {"embed_scale": False}, {"query_pre_attn_scalar": None}]
    if case != "global":
        changes += [{"rope_local_theta": None}, {"sliding_window": 2}]
    if case == "last_sliding":
        changes.append({"last_layer_full": True})
    for change in changes:
        ours = np.asarray(backbone.forward(cfg.replace(**change), params, jnp.asarray(TOKENS)))
        margin = 1e-3 * np.abs(theirs).max()
        assert_planted_fails(ours, theirs, cfg.num_layers, margin, str(change))


def test_what_does_not_map_is_refused():
    config = tiny_gemma3_config().to_dict()
    refused = {
        "window of 1": ({"layer_types": [FULL, SLIDING], "sliding_window": 1}, r"'LS' .*sliding_window=1 "),
        "no window": ({"layer_types": [SLIDING, FULL], "sliding_window": None}, r"sliding_window=None"),
        "rope scaling": (
            {"rope_parameters": {**config["rope_parameters"], FULL: {"rope_type": "linear", "factor": 8.0}}},
            r"rope type 'linear' on full-attention layers",
        ),
        "attention softcap": ({"attn_logit_softcapping": 50.0}, r"attn_logit_softcapping=50.0"),
        "activation": ({"hidden_activation": "gelu"}, r"hidden_activation 'gelu'"),
        "bidirectional": ({"use_bidirectional_attention": True}, r"use_bidirectional_attention"),
    }
    for name, (change, message) in refused.items():
        with pytest.raises(ValueError, match=message):
            model_config_from_hf({**config, **change})
            pytest.fail(f"{name} was not refused")


def test_transformers_4_spelling_maps_the_same():
    """4.x configs: rope_theta / rope_local_base_freq and the layer types from sliding_window_pattern."""
    config = tiny_gemma3_config().to_dict()
    new = model_config_from_hf(config)
    for key in ("rope_parameters", "layer_types", "_sliding_window_pattern"):
        config.pop(key)
    old = {**config, "rope_theta": 20000.0, "rope_local_base_freq": 5000.0, "sliding_window_pattern": 2}
    assert model_config_from_hf(old) == new
    assert new.window_pattern == "SL" and new.rope_local_theta == 5000.0


def test_gemma3_1b_layout_maps_exactly():
    """Gemma3 1B: 26 layers, every sixth full (5, 11, 17, 23), so the last two slide; 4.x spelling
    (sliding_window_pattern) and 5.x (layer_types) alike, HF's 512-key window (the query included) as 511."""
    config = Gemma3TextConfig(num_hidden_layers=26, sliding_window=512, max_position_embeddings=32768)
    cfg = model_config_from_hf(config.to_dict())
    assert (cfg.window_pattern, cfg.sliding_window, cfg.last_layer_full) == ("SSSSSL", 511, False)
    assert cfg.layer_windows == tuple(None if kind == FULL else 511 for kind in config.layer_types)
    assert config.layer_types[-2:] == [SLIDING, SLIDING]
    old = {k: v for k, v in config.to_dict().items() if k not in ("layer_types", "_sliding_window_pattern")}
    assert model_config_from_hf({**old, "sliding_window_pattern": 6}) == cfg


def test_export_is_refused(gemma3, tmp_path):
    _, _, _, cfg, params = gemma3
    with pytest.raises(ValueError, match=r"closest: 'qwen3', which has no .*norm_offset=True"):
        save_hf(cfg, params, tmp_path / "back")
