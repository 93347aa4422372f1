"""Shared helpers of the interop tests: tiny transformers models (the T²MLR side: tests/tiny.py), tree
comparisons, folders written the way the release writes them, the fp32 parity checks, and the nanochat
releases' fixtures (tests/interop/fixtures/*_release*/) read and checked against."""

import json
from pathlib import Path

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

from t2mlr_jax.architectures.t2mlr import T2MLRDecoder
from t2mlr_jax.formats.files import read_json, torch_state, torch_to_numpy
from t2mlr_jax.formats.nanochat import to_nanochat_state
from t2mlr_jax.interop import save_nanochat
from t2mlr_jax.model.generate import teacher_forced
from t2mlr_jax.studies.parity import gradient_scales, loss_and_grads, loss_bound, max_abs_diff, relative_bound
from tests.tolerance import assert_fp32_close, assert_within, record, scale_of


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


# fp32 parity checks (issue 50): every bound is tests/tolerance.py's depth rule, the depth counted by
# t2mlr_jax.studies.parity (`blocks`: 2 per layer and the path's two ends; `path_layers`: the layers on an
# output's longest path), the same rule tools/release_parity.py holds the releases to.


def assert_grads_parity(ours: dict, theirs: dict, layers: int, what: str = "gradient") -> None:
    """Every key's gradient within the depth rule of its path, the training forward (`layers` deep) and
    back: twice its blocks (parity.gradient_bound; 2 L + 1 layers' blocks), relative to its layer's max
    |release gradient|, a gain's to the model's (parity.gradient_scales)."""
    assert sorted(ours) == sorted(theirs)
    tops = {key: float(np.abs(value).max()) for key, value in theirs.items()}
    scales = gradient_scales(tops, {key: int(np.size(value)) for key, value in theirs.items()})
    for key, value in theirs.items():
        assert_fp32_close(ours[key], value, 2 * layers + 1, f"{what} {key}", scales[key])


def assert_loss_parity(ours, theirs, train_logits, layers: int, what: str = "loss") -> float:
    """|Δ loss| within parity.loss_bound: 2 x the training logits' bound (`train_logits` the release's,
    `layers` their path) plus one block of the loss's own round-off."""
    bound = loss_bound(relative_bound(layers) * scale_of(train_logits), float(theirs))
    return assert_within(abs(float(ours) - float(theirs)), bound, what)


def assert_planted_fails(
    got, want, layers: int, margin: float, what: str, scale: float | None = None
) -> None:
    """A planted mistake (a moved weight, a convention dropped) fails: its error is above its own margin
    (absolute) and above the depth rule's bound that the unchanged model is held to."""
    error = max_abs_diff(got, want)
    bound = relative_bound(layers) * (scale_of(want) if scale is None else scale)
    assert error > margin and error > bound, f"{what}: planted error {error:.3g} <= {max(margin, bound):.3g}"


def check_figures(figures: dict, what: str) -> None:
    """parity.compare's figures (or ponderlm2_parity's): each section's error and bound recorded for the
    headroom table (tests/tolerance.py), then every section passed."""
    for name, section in figures.items():
        if not isinstance(section, dict) or "tolerance" not in section:
            continue
        error = section.get("relative", section.get("max_relative_diff", section.get("abs_diff")))
        record(f"{what} {name}", error, section["tolerance"])
        if "loss_tolerance" in section:
            record(f"{what} {name} loss", section["loss_abs_diff"], section["loss_tolerance"])
    assert figures["passed"], figures


# The nanochat releases' fixtures (experiments/make_nanochat_fixture.py, make_karpathy_nanochat_fixture.py): a
# folder of model/ (the release's checkpoint) and release.npz (what its own code computed on `tokens`).


def numpy_state(path: Path) -> dict[str, np.ndarray]:
    """A torch checkpoint file's state dict as numpy arrays."""
    return {key: torch_to_numpy(value) for key, value in torch_state(path).items()}


def nanochat_release(folder: Path) -> tuple[dict, dict, dict, jax.Array]:
    """(release.npz's arrays, the checkpoint's meta, its state as numpy arrays, the tokens) of a fixture."""
    release = dict(np.load(folder / "release.npz"))
    meta = read_json(folder / "model/meta_000000.json")
    return release, meta, numpy_state(folder / "model/model_000000.pt"), jnp.asarray(release["tokens"])


def assert_release_gradients(cfg, params, release: dict, state: dict, layers: int) -> None:
    """Our loss and every gradient, by the release's state keys, against release.npz's `loss` and
    `grad:<key>` (one per key of the release's `state`), on its tokens."""
    loss, grads = loss_and_grads(cfg, params, jnp.asarray(release["tokens"]))
    assert_loss_parity(loss, release["loss"], release["logits"], layers)
    theirs = {key.split(":", 1)[1]: value for key, value in release.items() if key.startswith("grad:")}
    assert sorted(theirs) == sorted(state)
    assert_grads_parity(to_nanochat_state(cfg, grads), theirs, layers)


def assert_release_decode(cfg, params, release: dict, prefill: int, layers: int) -> None:
    """Our cached decode (the first `prefill` tokens at once, then one at a time) against release.npz's."""
    decoded = teacher_forced(T2MLRDecoder(cfg), params, jnp.asarray(release["tokens"]), prefill)
    scale = np.abs(release["logits"]).max()
    assert_fp32_close(decoded, release["decode"], layers, "cached decode", scale=scale)


def exported_nanochat(cfg, params, folder: Path) -> tuple[dict, dict]:
    """(the state as numpy arrays, the meta's model_config) of save_nanochat's checkpoint in `folder`."""
    save_nanochat(cfg, params, folder)
    return numpy_state(folder / "model_000000.pt"), read_json(folder / "meta_000000.json")["model_config"]
