"""Tiny fp32 models: bitwise round trips through every layout, logit parity with transformers and with
the PyTorch T²MLR reference, and clear errors on bad inputs."""

import json
import subprocess
import sys
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from transformers import LlamaForCausalLM

from t2mlr_jax.architectures.t2mlr import RecurrenceConfig, recurrence_from_release, release_from_recurrence
from t2mlr_jax.architectures.t2mlr.recurrence import exact_forward
from t2mlr_jax.formats.files import read_state_dict
from t2mlr_jax.interop import (
    T2MLRReference,
    load_hf,
    load_params,
    load_pretrained,
    load_t2mlr_torch,
    retrofit,
    save_hf,
    save_params,
    save_t2mlr_torch,
)
from t2mlr_jax.model import backbone
from t2mlr_jax.model.token_layout import make_layout
from t2mlr_jax.studies.parity import path_layers
from tests.interop.helpers import (
    ReleaseGatedMixer,
    assert_planted_fails,
    save_release_style,
    state_dicts_identical,
    tiny_llama_config,
    transformers_model,
    trees_identical,
)
from tests.tiny import interop_config, random_params
from tests.tolerance import assert_fp32_close

TOKENS = np.random.default_rng(0).integers(0, 61, (2, 10))


@partial(jax.jit, static_argnums=0)
def exact_logits(cfg, params, tokens, layout):
    return exact_forward(cfg, params, tokens, layout=layout).logits


def hf_folder(tmp_path, kv_heads, tied, name="hf"):
    model = transformers_model(tiny_llama_config(kv_heads, tied))
    model.save_pretrained(tmp_path / name)
    return model, tmp_path / name


# ---------------------------------------------------------------------------------------------
# HF Llama


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_hf_round_trip_is_bitwise(tmp_path, kv_heads, tied):
    _, src = hf_folder(tmp_path, kv_heads, tied)
    cfg, params = load_hf(src)
    assert (cfg.num_kv_heads, cfg.tie_embeddings, cfg.rope_theta) == (kv_heads, tied, 5000.0)
    save_hf(cfg, params, tmp_path / "back")
    assert state_dicts_identical(read_state_dict(src), read_state_dict(tmp_path / "back"))
    assert load_hf(tmp_path / "back")[0] == cfg


@pytest.mark.numerics
@pytest.mark.parametrize("kv_heads, tied", [(1, True), (2, False), (4, True)])
def test_hf_logits_match_transformers(tmp_path, kv_heads, tied):
    model, src = hf_folder(tmp_path, kv_heads, tied)
    cfg, params = load_hf(src)
    ours = np.asarray(backbone.forward(cfg, params, jnp.asarray(TOKENS)))
    with torch.no_grad():
        theirs = model(torch.as_tensor(TOKENS)).logits.numpy()
    assert_fp32_close(ours, theirs, cfg.num_layers, "logits")
    # ... and transformers loads our export unchanged, computing the same logits.
    save_hf(cfg, params, tmp_path / "export")
    reloaded = LlamaForCausalLM.from_pretrained(tmp_path / "export", dtype=torch.float32).eval()
    with torch.no_grad():
        exported = reloaded(torch.as_tensor(TOKENS)).logits.numpy()
    assert_fp32_close(exported, ours, cfg.num_layers, "transformers on our export")


def test_sharded_safetensors_and_plain_bin_load(tmp_path):
    model, src = hf_folder(tmp_path, 2, False)
    cfg, params = load_hf(src)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    keys = sorted(state)
    for folder, writer in (("sharded", "safetensors"), ("bin", "bin")):
        out = tmp_path / folder
        out.mkdir()
        (out / "config.json").write_text((src / "config.json").read_text())
        if writer == "safetensors":
            shards = {
                "model-00001-of-00002.safetensors": keys[::2],
                "model-00002-of-00002.safetensors": keys[1::2],
            }
            for name, names in shards.items():
                save_file({k: state[k] for k in names}, str(out / name), metadata={"format": "pt"})
            weight_map = {k: name for name, names in shards.items() for k in names}
            (out / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
        else:
            torch.save(state, out / "pytorch_model.bin")
        assert trees_identical(load_hf(out)[1], params)


# ---------------------------------------------------------------------------------------------
# The authors' T²MLR layout


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_t2mlr_round_trip_is_bitwise(tmp_path, kv_heads, tied):
    cfg = interop_config(kv_heads, tied)
    params = random_params(cfg, kv_heads)
    save_t2mlr_torch(cfg, params, tmp_path / "t2mlr")
    cfg_back, params_back = load_t2mlr_torch(tmp_path / "t2mlr")
    assert cfg_back == cfg and trees_identical(params_back, params)


T2MLR_VARIANTS = {
    "release-default": dict(),
    "tied-1kv-per-channel-prenorm-postnorm-raw-cache": dict(
        kv_heads=1,
        tied=True,
        gamma_per_channel=True,
        pre_norm=True,
        post_norm=True,
        temporal_residual=False,
        recurrent_projection=False,
        l_start=0,
        l_end=-1,
    ),
}


def assert_matches_torch_reference(cfg, params, folder):
    """Exact recurrence on both sides, within the depth rule of its path (parity.path_layers: L + (T - 1) W
    with every position recurrent, the longest); prompt positions (control flow 1) are neither fused nor
    residual-updated. Returns the plain forward's logits and the reference's (its last control flow)."""
    reference = T2MLRReference.from_pretrained(folder)
    layers = path_layers(cfg, params, TOKENS.shape[1])["logits"]
    prompt_then_recurrent = np.where(np.arange(TOKENS.shape[1]) < 4, 1, 2)[None].repeat(2, 0)
    prompt_then_recurrent[1, 6] = 1
    for control in (np.full_like(TOKENS, 2), prompt_then_recurrent):
        ours = exact_logits(
            cfg,
            params,
            jnp.asarray(TOKENS),
            make_layout(jnp.asarray(TOKENS), control_flow=jnp.asarray(control)),
        )
        theirs = reference(torch.as_tensor(TOKENS), torch.as_tensor(control)).numpy()
        assert_fp32_close(ours, theirs, layers, "exact recurrence vs the torch reference")
    return np.asarray(backbone.forward(cfg, params, jnp.asarray(TOKENS))), theirs


@pytest.mark.numerics
@pytest.mark.parametrize("variant", T2MLR_VARIANTS)
def test_t2mlr_logits_match_torch_reference(tmp_path, variant):
    cfg = interop_config(**T2MLR_VARIANTS[variant])
    params = random_params(cfg, 3)  # every γ != 0
    save_t2mlr_torch(cfg, params, tmp_path / "t2mlr")
    plain, theirs = assert_matches_torch_reference(cfg, params, tmp_path / "t2mlr")
    layers = path_layers(cfg, params, TOKENS.shape[1])["logits"]
    assert_planted_fails(plain, theirs, layers, 1e-2, "the plain forward")  # the recurrence is really on


@pytest.mark.slow
@pytest.mark.numerics
def test_the_torch_reference_needs_no_jax(tmp_path):
    cfg = interop_config(mixer="codi", pre_norm=True)
    params = random_params(cfg, 4)
    save_t2mlr_torch(cfg, params, tmp_path / "t2mlr")
    np.save(tmp_path / "tokens.npy", TOKENS)
    code = (
        "import sys; sys.modules['jax'] = None\n"
        "import numpy as np, torch\n"
        "from t2mlr_jax.architectures.t2mlr.torch_reference import T2MLRReference\n"
        f"model = T2MLRReference.from_pretrained({str(tmp_path / 't2mlr')!r})\n"
        f"tokens = torch.as_tensor(np.load({str(tmp_path / 'tokens.npy')!r}))\n"
        f"np.save({str(tmp_path / 'logits.npy')!r}, model(tokens).numpy())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    ours = exact_logits(cfg, params, jnp.asarray(TOKENS), make_layout(jnp.asarray(TOKENS)))
    layers = path_layers(cfg, params, TOKENS.shape[1])["logits"]
    assert_fp32_close(ours, np.load(tmp_path / "logits.npy"), layers, "torch reference without jax")


@pytest.mark.numerics
def test_release_written_folder_imports_and_round_trips(tmp_path):
    """A folder laid out by torch itself the way the release saves it (key names from module nesting)."""
    llama = transformers_model(tiny_llama_config(kv_heads=2, tied=True), seed=5)
    cfg = interop_config(tied=True)
    settings = {
        **release_from_recurrence(RecurrenceConfig(l_start=1, l_end=-1), 32),
        "batch_forward": True,
        "connection_detach": False,
        "freeze_base_model": False,
    }
    cfg = cfg.replace(num_layers=3, recurrence=recurrence_from_release(settings, 32))
    torch.manual_seed(6)
    save_release_style(tmp_path / "release", llama, ReleaseGatedMixer(32), 1, settings)
    loaded_cfg, params = load_pretrained(tmp_path / "release")
    assert loaded_cfg.recurrence == cfg.recurrence and loaded_cfg.tie_embeddings
    save_t2mlr_torch(loaded_cfg, params, tmp_path / "back")
    assert state_dicts_identical(read_state_dict(tmp_path / "release"), read_state_dict(tmp_path / "back"))
    ours = np.asarray(exact_logits(loaded_cfg, params, jnp.asarray(TOKENS), make_layout(jnp.asarray(TOKENS))))
    reference = T2MLRReference.from_pretrained(tmp_path / "release")(torch.as_tensor(TOKENS)).numpy()
    layers = path_layers(loaded_cfg, params, TOKENS.shape[1])["logits"]
    assert_fp32_close(ours, reference, layers, "release-written folder vs the torch reference")


def test_settings_a_release_config_omits_take_the_release_defaults():
    rec = recurrence_from_release({"recurrent_mixing_module_name": "gated", "use_learnable_gate": True}, 32)
    assert (
        rec.l_start,
        rec.l_end,
        rec.recurrent_projection,
        rec.temporal_residual,
        rec.cache_norm,
        rec.d_forward,
    ) == (0, -1, False, False, "none", 1)


@pytest.mark.numerics
@pytest.mark.parametrize(
    "mixer",
    [
        "gated_fixed",
        "var_norm_gated",
        "alpha_coupled",
        "constant_weight",
        "concat",
        "exponential_rotational_gated",
        "coconut",
        "codi",
        "none",
    ],
)
def test_every_release_mixer_round_trips_and_matches_the_torch_reference(tmp_path, mixer):
    # Pre/post norms on where a mixer has them, so their torch counterparts are exercised too.
    cfg = interop_config(
        mixer=mixer,
        gamma_per_channel=mixer == "alpha_coupled",
        pre_norm=mixer != "none",
        post_norm=mixer in ("var_norm_gated", "coconut", "codi", "exponential_rotational_gated"),
        bottleneck_size=24 if mixer == "codi" else None,  # the release's CODI width, not the hidden size
    )
    params = random_params(cfg, 7)
    save_t2mlr_torch(cfg, params, tmp_path / "t2mlr")
    cfg_back, params_back = load_t2mlr_torch(tmp_path / "t2mlr")
    assert cfg_back == cfg and trees_identical(params_back, params)
    plain, theirs = assert_matches_torch_reference(cfg, params, tmp_path / "t2mlr")
    if mixer == "none":  # the plain transformer: its forward is the reference's, its 4 layers deep
        assert_fp32_close(plain, theirs, cfg.num_layers, "mixer none: the plain forward")
    else:
        layers = path_layers(cfg, params, TOKENS.shape[1])["logits"]
        assert_planted_fails(plain, theirs, layers, 1e-2, f"mixer {mixer}: the plain forward")


# ---------------------------------------------------------------------------------------------
# Our checkpoints, dispatch and retrofit


def test_orbax_round_trip_and_dispatch(tmp_path):
    cfg = interop_config()
    params = random_params(cfg, 8)
    save_params(tmp_path / "ckpt", cfg, params)
    for loaded in (load_params(tmp_path / "ckpt"), load_pretrained(tmp_path / "ckpt")):
        assert loaded[0] == cfg and trees_identical(loaded[1], params)


def test_retrofit_adds_an_identity_mixer(tmp_path):
    _, src = hf_folder(tmp_path, 2, True)
    cfg, params = load_pretrained(src)
    rcfg, rparams = retrofit(cfg, params, RecurrenceConfig(l_start=1, l_end=1), jax.random.key(0))
    assert set(rparams) == set(params) | {"mixer"}
    assert all(not np.asarray(v).any() for k, v in rparams["mixer"].items() if k.startswith("rezero_gamma"))
    with pytest.raises(ValueError, match="already has a recurrence"):
        retrofit(rcfg, rparams, RecurrenceConfig(), jax.random.key(0))
    with pytest.raises(ValueError, match="not the identity"):
        retrofit(cfg, params, RecurrenceConfig(mixer="coconut"), jax.random.key(0))


# ---------------------------------------------------------------------------------------------
# Bad inputs


def rewrite(folder, edit):
    state = {k: torch.from_numpy(np.array(v)) for k, v in read_state_dict(folder).items()}
    edit(state)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})


def test_missing_unexpected_and_misshaped_keys_are_listed_together(tmp_path):
    _, src = hf_folder(tmp_path, 2, False)

    def edit(state):
        del state["model.layers.1.mlp.up_proj.weight"]
        state["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(32)
        state["model.layers.2.self_attn.k_proj.weight"] = torch.zeros(8, 32)

    rewrite(src, edit)
    with pytest.raises(ValueError) as error:
        load_hf(src)
    message = str(error.value)
    assert "3 problems" in message
    assert "missing key model.layers.1.mlp.up_proj.weight" in message
    assert "unexpected key model.layers.0.self_attn.q_proj.bias" in message
    assert "model.layers.2.self_attn.k_proj.weight: shape (8, 32), expected (16, 32)" in message


def test_t2mlr_missing_mixer_key_is_refused(tmp_path):
    cfg = interop_config()
    save_t2mlr_torch(cfg, random_params(cfg, 0), tmp_path / "t2mlr")
    key = "t2mlr_model.model.layers.1.t2mlr_mixing_module.recurrent_projection.weight"
    rewrite(tmp_path / "t2mlr", lambda state: state.pop(key))
    with pytest.raises(ValueError, match=f"missing key {key}"):
        load_t2mlr_torch(tmp_path / "t2mlr")
    with pytest.raises(ValueError, match="mixer: missing key recurrent_projection.weight"):
        T2MLRReference.from_pretrained(tmp_path / "t2mlr")


class NotATensor:
    pass


def test_unsafe_bin_is_refused(tmp_path):
    _, src = hf_folder(tmp_path, 2, True)
    (src / "model.safetensors").unlink()
    torch.save({"model.embed_tokens.weight": NotATensor()}, src / "pytorch_model.bin")
    with pytest.raises(ValueError, match="refusing to load this .bin file"):
        load_hf(src)


def test_unsupported_settings_are_refused(tmp_path):
    _, src = hf_folder(tmp_path, 2, True)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "attention_bias": True, "hidden_act": "gelu"}))
    with pytest.raises(ValueError, match=r"(?s)hidden_act 'gelu'.*attention_bias"):
        load_hf(src)
    settings = {
        **release_from_recurrence(RecurrenceConfig(), 32),
        "recurrent_skip_to_l_end": True,
        "use_learnable_input_gate": False,
        "mixing_module_kwargs": {"orig_weight": 0.5},
    }
    with pytest.raises(
        ValueError, match=r"(?s)orig_weight.*recurrent_skip_to_l_end.*use_learnable_input_gate"
    ):
        recurrence_from_release(settings, 32)
    with pytest.raises(ValueError, match="no equivalent in the release"):
        save_t2mlr_torch(interop_config(cache_norm="rmsnorm"), {}, tmp_path / "x")


def test_params_not_matching_the_config_are_refused(tmp_path):
    cfg = interop_config()
    params = random_params(cfg, 0)
    params["norm"] = params["norm"][:-1]
    del params["mixer"]["input_gate_proj"]
    with pytest.raises(ValueError, match=r"(?s)missing mixer/input_gate_proj/bias.*norm: shape \(31,\)"):
        save_t2mlr_torch(cfg, params, tmp_path / "t2mlr")
    with pytest.raises(ValueError, match="drop_recurrence=True"):
        save_hf(cfg, params, tmp_path / "hf")
