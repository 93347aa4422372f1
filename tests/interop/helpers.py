"""Shared helpers of the interop tests: tiny models on both sides, built independently."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import torch
from safetensors.torch import save_file
from torch import nn
from transformers import (
    AutoModelForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    Qwen3Config,
)

from t2mlr_jax.model.config import ModelConfig, RecurrenceConfig
from t2mlr_jax.model.params import init_params


def tiny_llama_config(kv_heads: int = 2, tied: bool = True) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=61,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        head_dim=8,
        rms_norm_eps=1e-5,
        tie_word_embeddings=tied,
        rope_parameters={"rope_type": "default", "rope_theta": 5000.0},
        max_position_embeddings=128,
    )


def tiny_qwen3_config(tied: bool = True) -> Qwen3Config:
    """head_dim 16 != hidden / heads, so only an explicit head_dim gives the right shapes."""
    return Qwen3Config(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=1e-6,
        tie_word_embeddings=tied,
        rope_parameters={"rope_type": "default", "rope_theta": 20000.0},
        max_position_embeddings=256,
    )


def tiny_gemma3_config(
    layer_types=("sliding_attention", "full_attention") * 2, **changes
) -> Gemma3TextConfig:
    """head_dim 16 != hidden / heads and query_pre_attn_scalar 24 != head_dim, sliding layers over 4 keys
    with their own RoPE base, so a wrong scale, window or base would show."""
    return Gemma3TextConfig(
        **{
            "vocab_size": 128,
            "hidden_size": 64,
            "intermediate_size": 96,
            "num_hidden_layers": len(layer_types),
            "layer_types": list(layer_types),
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "query_pre_attn_scalar": 24,
            "sliding_window": 4,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {
                "full_attention": {"rope_type": "default", "rope_theta": 20000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 5000.0},
            },
            "max_position_embeddings": 256,
            **changes,
        }
    )


def transformers_model(config: PretrainedConfig, seed: int = 0) -> PreTrainedModel:
    """A random fp32 transformers model of the config's type with non-trivial norms (Qwen3's q_norm /
    k_norm included), so a swapped norm weight would show."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


def tiny_t2mlr_config(kv_heads: int = 2, tied: bool = False, **recurrence) -> ModelConfig:
    rec = RecurrenceConfig(**{"l_start": 1, "l_end": 2, **recurrence})
    return ModelConfig(
        vocab_size=61,
        hidden_size=32,
        num_layers=4,
        num_heads=4,
        num_kv_heads=kv_heads,
        head_dim=8,
        mlp_dim=48,
        rope_theta=5000.0,
        tie_embeddings=tied,
        recurrence=rec,
    ).validate()


def random_params(cfg: ModelConfig, seed: int = 0) -> dict:
    """Random parameters drawn with numpy (JAX's RNG would compile once per shape): weights ~ N(0, 0.1),
    norm scales in [0.5, 1.5], and every γ in [0.5, 1] so the fusion is on."""
    rng = np.random.default_rng(seed)

    def draw(path, leaf):
        name = jax.tree_util.keystr(path)
        if "norm" in name or "scale" in name:
            value = rng.uniform(0.5, 1.5, leaf.shape)
        elif "gamma" in name:
            value = rng.uniform(0.5, 1.0, leaf.shape)
        else:
            value = rng.normal(0.0, 0.1, leaf.shape)
        return jnp.asarray(value, leaf.dtype)

    return jax.tree_util.tree_map_with_path(draw, jax.eval_shape(lambda: init_params(cfg, jax.random.key(0))))


def trees_identical(a, b) -> bool:
    same_structure = jax.tree.structure(a) == jax.tree.structure(b)
    return same_structure and all(
        x.dtype == y.dtype and np.array_equal(np.asarray(x), np.asarray(y))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
    )


def state_dicts_identical(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]) for k in a)


class ReleaseGatedMixer(nn.Module):
    """The release's gated mixing module, structurally: W_rec without a bias, two Linear([x ; r]) gates and
    the two scalar ReZero gammas, so torch itself names the keys."""

    def __init__(self, d: int):
        super().__init__()
        self.recurrent_projection = nn.Linear(d, d, bias=False)
        self.recurrent_gate_proj, self.input_gate_proj = nn.Linear(2 * d, d), nn.Linear(2 * d, d)
        self.rezero_gamma_recurrent_gate = nn.Parameter(torch.full((1,), 0.8))
        self.rezero_gamma_input_gate = nn.Parameter(torch.full((1,), -0.3))


class BlockWrapper(nn.Module):
    """The release's BlockWrapper, structurally: the block under `.model`, the mixer beside it."""

    def __init__(self, block: nn.Module, mixer: nn.Module):
        super().__init__()
        self.model, self.t2mlr_mixing_module = block, mixer


class Wrapper(nn.Module):
    """The release's T2MLRWrapper, structurally: the wrapped Llama under `.t2mlr_model`."""

    def __init__(self, llama: nn.Module):
        super().__init__()
        self.t2mlr_model = llama


def save_release_style(
    folder, llama: LlamaForCausalLM, mixer: nn.Module, l_start: int, settings: dict
) -> None:
    """Write a folder the way the release's save_pretrained does, key names generated by torch itself."""
    llama.model.layers[l_start] = BlockWrapper(llama.model.layers[l_start], mixer)
    state = {k: v.detach().clone().contiguous() for k, v in Wrapper(llama).state_dict().items()}
    if llama.config.tie_word_embeddings:
        state.pop("t2mlr_model.lm_head.weight")
    folder.mkdir(parents=True, exist_ok=True)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = {
        "model_type": "t2mlr",
        "architectures": ["T2MLRWrapper"],
        "base_model_type": "llama",
        "base_config": llama.config.to_dict(),
        "return_dict": True,
        "torch_dtype": "float32",
        "transformers_version": "4.57.1",
        **settings,
    }
    (folder / "config.json").write_text(json.dumps(config))
