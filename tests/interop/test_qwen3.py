"""HF Qwen3 (Llama plus QK-RMSNorm before RoPE) as a config of our backbone: logit parity with transformers,
a bitwise round trip that transformers loads back as Qwen3, and clear refusals of what does not map."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

from t2mlr_jax.architectures.t2mlr import model_config_from_release, recurrent, release_config
from t2mlr_jax.formats.configs import hf_config_from_model, model_config_from_hf
from t2mlr_jax.formats.files import read_state_dict
from t2mlr_jax.interop import load_hf, load_pretrained, save_hf
from t2mlr_jax.interop.pretrained import checkpoint_format
from t2mlr_jax.model import backbone
from tests.interop.helpers import (
    assert_planted_fails,
    state_dicts_identical,
    tiny_qwen3_config,
    transformers_model,
)
from tests.tolerance import assert_fp32_close

TOKENS = np.random.default_rng(0).integers(0, 128, (2, 12))


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def qwen3(request, tmp_path_factory):
    """A random transformers Qwen3 saved as an HF folder, its logits, and what we load from the folder."""
    folder = tmp_path_factory.mktemp("qwen3") / "hf"
    model = transformers_model(tiny_qwen3_config(tied=request.param), seed=1)
    model.save_pretrained(folder)
    with torch.no_grad():
        logits = model(torch.as_tensor(TOKENS)).logits.numpy()
    assert checkpoint_format(folder) == "hf"
    cfg, params = load_pretrained(folder)
    return folder, logits, cfg, params


def test_config_maps_every_field(qwen3):
    folder, _, cfg, _ = qwen3
    tied = json.loads((folder / "config.json").read_text())["tie_word_embeddings"]
    assert (cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (
        64,
        2,
        4,
        2,
        16,
    )
    assert (cfg.mlp_dim, cfg.vocab_size, cfg.max_seq_len) == (96, 128, 256)
    assert (cfg.rope_theta, cfg.norm_eps, cfg.tie_embeddings, cfg.qk_norm) == (
        20000.0,
        1e-6,
        tied,
        "before_rope",
    )


@pytest.mark.numerics
def test_logits_match_transformers(qwen3):
    _, theirs, cfg, params = qwen3
    assert_fp32_close(backbone.forward(cfg, params, jnp.asarray(TOKENS)), theirs, cfg.num_layers, "logits")


@pytest.mark.numerics
def test_round_trip_is_bitwise_and_transformers_loads_it_as_qwen3(qwen3, tmp_path):
    folder, theirs, cfg, params = qwen3
    save_hf(cfg, params, tmp_path / "back")
    assert state_dicts_identical(read_state_dict(folder), read_state_dict(tmp_path / "back"))
    assert load_hf(tmp_path / "back")[0] == cfg
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "back", dtype=torch.float32).eval()
    assert isinstance(reloaded, Qwen3ForCausalLM)
    with torch.no_grad():
        reloaded_logits = reloaded(torch.as_tensor(TOKENS)).logits.numpy()
    assert_fp32_close(reloaded_logits, theirs, cfg.num_layers, "transformers on our export")


@pytest.mark.parametrize("model_type", ["gemma3", "gemma2", "phi", "gpt_neox", "mistral", None])
def test_other_model_types_are_refused_in_one_line(qwen3, tmp_path, model_type):
    config = {**json.loads((qwen3[0] / "config.json").read_text()), "model_type": model_type}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError) as error:
        load_pretrained(tmp_path)
    assert str(error.value) == (
        f"HF config: model_type {model_type!r} is not supported (supported: 'llama', 'qwen3', 'gemma3_text')"
    )


def test_sliding_windows_map_and_biases_are_refused(qwen3):
    config = json.loads((qwen3[0] / "config.json").read_text())
    del config["layer_types"]  # as transformers 4.x wrote it: the layer types follow from max_window_layers
    windows = {"use_sliding_window": True, "sliding_window": 8}
    # Layers from max_window_layers up slide over 8 keys counting the query: 7 slots back, the last layer too.
    cfg = model_config_from_hf({**config, **windows, "max_window_layers": 1})
    assert (cfg.window_pattern, cfg.sliding_window, cfg.last_layer_full) == ("LS", 7, False)
    assert cfg.layer_windows == (None, 7) and cfg.rope_local_theta is None
    with pytest.raises(ValueError, match=r"attention_bias=true"):
        model_config_from_hf({**config, **windows, "max_window_layers": 1, "attention_bias": True})
    # Sliding layers without use_sliding_window have no window (transformers itself fails on them).
    with pytest.raises(ValueError, match=r"HF qwen3 config: .*\n.*'SS' .*sliding_window=None"):
        model_config_from_hf({**config, "layer_types": ["sliding_attention"] * 2})
    # Windows switched on but starting above the last layer: every layer is full, which maps exactly.
    assert model_config_from_hf({**config, **windows, "max_window_layers": 2}) == qwen3[2]
    # transformers' Llama ignores windows: a Llama config asking for them is refused.
    llama = {**config, **windows, "model_type": "llama", "max_window_layers": 0}
    with pytest.raises(ValueError, match=r"HF llama config: .*\n.*layers \[0, 1\] .*Llama does not apply"):
        model_config_from_hf(llama)


@pytest.mark.numerics
def test_last_sliding_layer_logits_match_transformers(tmp_path):
    """A Qwen3 whose windows (3 keys counting the query << 12 tokens) start at layer 1 of 3: the last
    layer slides, as a per-layer pattern; logits as transformers', and the export refuses the windows."""
    config = Qwen3Config.from_dict(
        {
            **tiny_qwen3_config().to_dict(),
            "num_hidden_layers": 3,
            "use_sliding_window": True,
            "sliding_window": 3,
            "max_window_layers": 1,
            "layer_types": None,
        }
    )
    assert config.layer_types == ["full_attention", "sliding_attention", "sliding_attention"]
    model = transformers_model(config, seed=3)
    model.save_pretrained(tmp_path / "hf")
    with torch.no_grad():
        theirs = model(torch.as_tensor(TOKENS)).logits.numpy()
    cfg, params = load_pretrained(tmp_path / "hf")
    assert (cfg.window_pattern, cfg.sliding_window, cfg.last_layer_full) == ("LSS", 2, False)
    ours = np.asarray(backbone.forward(cfg, params, jnp.asarray(TOKENS)))
    print(f"relative max error {np.abs(ours - theirs).max() / np.abs(theirs).max():.2e}")
    assert_fp32_close(ours, theirs, cfg.num_layers, "logits")
    full = np.asarray(backbone.forward(cfg.replace(last_layer_full=True), params, jnp.asarray(TOKENS)))
    margin = 1e-4 * np.abs(theirs).max()  # the last layer's window matters
    assert_planted_fails(full, theirs, cfg.num_layers, margin, "last layer full")
    with pytest.raises(ValueError, match=r"closest: 'qwen3', which has no .*last_layer_full=False"):
        save_hf(cfg, params, tmp_path / "back")


def test_blocks_without_an_hf_type_are_refused_on_export(qwen3):
    cfg = qwen3[2]
    with pytest.raises(
        ValueError, match=r"closest: 'qwen3', which has no window_pattern='SL', sliding_window=4\)"
    ):
        hf_config_from_model(cfg.replace(window_pattern="SL", sliding_window=4))
    with pytest.raises(ValueError, match=r"closest: 'llama', which has no qk_norm='after_rope'\)"):
        hf_config_from_model(cfg.replace(qk_norm="after_rope"))
    # The authors' release wraps Llama only, both ways.
    with pytest.raises(ValueError, match="the release wraps HF 'llama' only"):
        release_config(recurrent(cfg, l_start=0, l_end=1))
    release = {"model_type": "t2mlr", "base_config": hf_config_from_model(cfg)}
    with pytest.raises(ValueError, match=r"model_type 'qwen3' is not supported \(supported: 'llama'\)"):
        model_config_from_release(release)
