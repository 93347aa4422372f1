"""nanochat's checkpoint format (karpathy/nanochat's checkpoint_manager, and the LRT release's fork of it)
<-> our (ModelConfig, params).

Two GPTs share the format, told apart by the GPTConfig its meta.json records: the LRT release's fork
(its config has the fork's use_* / ve_gate_channels fields) and karpathy/nanochat's own as of 92d63d4
(only the seven base fields), our `nanochat(variant="karpathy")`: smear (smear_gate [1, 24],
smear_lambda [1]) and backout (backout_lambda [1]) besides the keys below, value-embedding gates over
12 channels, RoPE base 100,000 with float32 tables (its COMPUTE_DTYPE on a CPU: exact parity is fp32's).

A checkpoint folder holds model_<step>.pt (the GPT's state dict, torch.save) and meta_<step>.json (its
GPTConfig under "model_config", with whatever else the trainer recorded); the largest step is read. The
GPT it describes is our `nanochat()` backbone with a dense relu² MLP:

  transformer.wte.weight              embed_tokens   [V', D] (V' = V padded to a multiple of 64)
  transformer.h.{i}.attn.c_q/c_k/c_v  q_proj, k_proj, v_proj (Linear weights, [out, in])
  transformer.h.{i}.attn.c_proj       o_proj
  transformer.h.{i}.attn.ve_gate      ve_gate, on the layers with value embeddings only (zeros elsewhere)
  transformer.h.{i}.mlp.c_fc / c_proj up_proj, down_proj
  value_embeds.{i}.weight             value_embeds[j] for the j-th layer with value embeddings [V', K*E]
  lm_head.weight                      lm_head        [V', D]
  resid_lambdas, x0_lambdas           the per-layer scalars

nanochat rotates pairs (i, i + E/2) the other way round from HF's rotate-half (y1 = x1 cos + x2 sin). So
that our RoPE computes its attention exactly, the second half of every query / key head is negated on the
way in and out: QK-norm and q·k do not see the sign, and the rotation becomes HF's. The padding rows of
the vocabulary tables are never read (ids < V, logits sliced to V); an export writes them as zeros.

A fork's GPT with tensors of its own (the LRT release's interleaved, recurrent GPT: use_interleaved) is a
`GPTVariant` its system registers in VARIANTS (t2mlr_jax.architectures.lrt), since those tensors are that
system's parameters. Not importable: one of the resid / x0 scalars without the other.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from t2mlr_jax.formats.configs import refuse
from t2mlr_jax.formats.files import (
    check_export_target,
    numpy_to_torch,
    read_json,
    torch_state,
    torch_to_numpy,
)
from t2mlr_jax.formats.registry import RELEASE, CheckpointFormat, holds_no_recurrence, naming, register_format
from t2mlr_jax.formats.tables import check_params, from_torch, to_torch, torch_shape
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.params import param_specs
from t2mlr_jax.model.presets import nanochat
from t2mlr_jax.model.spec import is_spec, spec_leaves
from t2mlr_jax.registry import Registry

MODEL_FILE = re.compile(r"model_(\d+)\.pt")
PAD_VOCAB_TO = 64  # nanochat's GPT pads its vocabulary tables to a multiple of this
ROTATED = ("q_proj", "k_proj", "k_fb")  # their heads' second halves change sign (module docstring)
LAYER_KEYS = {  # ours under params["layers"] -> nanochat's key under transformer.h.{i}.
    ("self_attn", "q_proj"): "attn.c_q.weight",
    ("self_attn", "k_proj"): "attn.c_k.weight",
    ("self_attn", "v_proj"): "attn.c_v.weight",
    ("self_attn", "o_proj"): "attn.c_proj.weight",
    ("mlp", "up_proj"): "mlp.c_fc.weight",
    ("mlp", "down_proj"): "mlp.c_proj.weight",
}
VE_GATE = "attn.ve_gate.weight"
# The LRT fork's GPTConfig fields: a config with none of them is karpathy/nanochat's (module docstring).
LRT_FIELDS = (
    "use_value_embeds",
    "ve_every_layer",
    "use_x0_residual",
    "use_resid_lambdas",
    "ve_gate_channels",
    "use_interleaved",
)
KARPATHY_SCALARS = {  # ours -> karpathy/nanochat's key: smear's gate and scalar, backout's scalar
    ("smear_gate",): "smear_gate.weight",
    ("smear_lambda",): "smear_lambda",
    ("backout_lambda",): "backout_lambda",
}
INTERLEAVED = "use_interleaved"  # the LRT fork's flag of its interleaved GPT, a registered GPTVariant
# (nanochat key, our path, block or None, our shape for that key, Linear fan-in dims) of one tensor
Entry = tuple[str, tuple[str, ...], int | None, tuple[int, ...], int]


@dataclasses.dataclass(frozen=True)
class GPTVariant:
    """A fork's GPT: the plain one plus tensors of its own, kept in params[params_key]."""

    params_key: str
    specs: Callable[[ModelConfig], dict]  # its whole parameter table
    layer_entries: Callable[[ModelConfig, dict, int], Iterator[Entry]]  # its tensors of layer i (given specs)
    entries: Callable[[ModelConfig, dict], Iterator[Entry]]  # its tensors outside the layers
    value_embeds: str  # the key of its value embeddings ({i}: the layer)
    gates: Callable[[ModelConfig], dict[str, tuple[int, ...]]]  # its gates' keys and shapes, split apart:
    read_gates: Callable[[ModelConfig, dict, dict], None]  # (cfg, state, params): into params, in place
    write_gates: Callable[[ModelConfig, dict, dict], None]  # (cfg, params, state): into state, in place
    refusal: str  # why an orbax model checkpoint cannot hold it ("{source} is <refusal>")


VARIANTS = Registry("nanochat GPT variant")  # by the GPTConfig flag that selects one


def variant_of(gpt: dict) -> GPTVariant | None:
    """The variant a GPTConfig (as meta.json records it) selects (registered once its system is imported);
    None: the plain GPT."""
    return VARIANTS.get(INTERLEAVED) if gpt.get(INTERLEAVED) else None


def variant_held(params: dict) -> GPTVariant | None:
    """The variant whose tensors `params` hold; None: the plain GPT's."""
    return next((variant for _, variant in VARIANTS.items() if variant.params_key in params), None)


def checkpoint_files(path: Path | str) -> tuple[Path, Path] | None:
    """(model_<step>.pt, meta_<step>.json) of the folder's largest step, None if it holds no such pair."""
    path = Path(path)
    if not path.is_dir():
        return None
    steps = sorted(int(m.group(1)) for p in path.iterdir() if (m := MODEL_FILE.fullmatch(p.name)))
    for step in reversed(steps):
        meta = path / f"meta_{step:06d}.json"
        if meta.exists():
            return path / f"model_{step:06d}.pt", meta
    return None


def is_nanochat_checkpoint(path: Path | str) -> bool:
    return checkpoint_files(path) is not None


def padded_vocab(vocab_size: int) -> int:
    return -(-vocab_size // PAD_VOCAB_TO) * PAD_VOCAB_TO


def is_karpathy(gpt: dict) -> bool:
    """Whether a GPTConfig (as meta.json records it) is karpathy/nanochat's own GPT, not the LRT fork's."""
    return not any(field in gpt for field in LRT_FIELDS)


def model_config_from_nanochat(gpt: dict, *, param_dtype: str = "float32") -> ModelConfig:
    """Our ModelConfig of a nanochat GPTConfig (as its meta.json records it); what we cannot compute exactly
    is one error listing every such setting."""
    gpt = {"window_pattern": "L", **gpt}  # checkpoint_manager's default for checkpoints from before windows
    if is_karpathy(gpt):
        return _karpathy_config(gpt, param_dtype)
    problems = []
    if gpt.get("use_resid_lambdas", True) != gpt.get("use_x0_residual", True):
        problems.append("use_resid_lambdas and use_x0_residual differ: ours has both scalars or neither")
    if gpt["n_embd"] % gpt["n_head"]:
        problems.append(f"n_embd {gpt['n_embd']} is not a multiple of n_head {gpt['n_head']}")
    refuse(problems, "this nanochat checkpoint")
    width, seq_len = gpt["n_embd"], gpt["sequence_len"]
    return nanochat(
        gpt["n_layer"],
        seq_len=seq_len,
        width=width,
        head_dim=width // gpt["n_head"],
        vocab_size=gpt["vocab_size"],
        num_kv_heads=gpt["n_kv_head"],
        mlp="relu2",
        mlp_dim=4 * width,
        window_pattern=gpt["window_pattern"].upper(),
        resid_scalars=gpt.get("use_resid_lambdas", True),
        # an interleaved model's token-indexed init value embeddings are ours on every layer
        value_embeds=bool(gpt.get(INTERLEAVED)) or gpt.get("use_value_embeds", True),
        ve_every_layer=bool(gpt.get(INTERLEAVED) or gpt.get("ve_every_layer")),
        gate_channels=gpt.get("ve_gate_channels", 32) or width,
        dtype="float32",
        param_dtype=param_dtype,
    )


def _karpathy_config(gpt: dict, param_dtype: str) -> ModelConfig:
    """karpathy/nanochat's GPT (92d63d4): its every convention is the preset's variant="karpathy"."""
    if gpt["n_embd"] % gpt["n_head"]:
        refuse(
            [f"n_embd {gpt['n_embd']} is not a multiple of n_head {gpt['n_head']}"],
            "this nanochat checkpoint",
        )
    width, seq_len, pattern = gpt["n_embd"], gpt["sequence_len"], gpt["window_pattern"].upper()
    changes = {} if "S" in pattern else {"sliding_window": None}
    return nanochat(
        gpt["n_layer"],
        seq_len=seq_len,
        width=width,
        head_dim=width // gpt["n_head"],
        variant="karpathy",
        vocab_size=gpt["vocab_size"],
        num_kv_heads=gpt["n_kv_head"],
        mlp="relu2",
        mlp_dim=4 * width,
        window_pattern=pattern,
        rope_table_dtype="float32",
        dtype="float32",
        param_dtype=param_dtype,
        **changes,
    )


def nanochat_gpt_config(cfg: ModelConfig, *, interleaved: bool = False) -> dict:
    """The GPTConfig fields of our model (with `interleaved`, the LRT fork's interleaved GPT's), refused
    (every problem listed) unless nanochat's GPT computes it."""
    gpt = {
        "sequence_len": cfg.max_seq_len,
        "vocab_size": cfg.vocab_size,
        "n_layer": cfg.num_layers,
        "n_head": cfg.num_heads,
        "n_kv_head": cfg.num_kv_heads,
        "n_embd": cfg.hidden_size,
        "window_pattern": cfg.window_pattern,
    }
    if cfg.smear_channels is None:  # karpathy/nanochat's GPT has smear, the LRT fork's has not
        gpt |= _lrt_fields(cfg, interleaved)
    expected = model_config_from_nanochat(gpt, param_dtype=cfg.param_dtype)
    differ = [
        f"{f.name}: {getattr(cfg, f.name)!r} (nanochat's: {getattr(expected, f.name)!r})"
        for f in dataclasses.fields(ModelConfig)
        if f.name not in ("dtype", "remat", "scan_layers", "attention_impl", "init_scheme", "init_std")
        and getattr(cfg, f.name) != getattr(expected, f.name)
    ]
    refuse(differ, "a nanochat export (its GPT computes only its own backbone)")
    return gpt


def _lrt_fields(cfg: ModelConfig, interleaved: bool) -> dict:
    """The LRT fork's own GPTConfig fields of our model."""
    return {
        "use_value_embeds": cfg.value_embeds,  # (ignored by an interleaved model: its init ones replace them)
        "ve_every_layer": cfg.ve_every_layer and not interleaved,
        "use_x0_residual": cfg.resid_scalars,
        "use_resid_lambdas": cfg.resid_scalars,
        "ve_gate_channels": cfg.gate_channels,
        INTERLEAVED: interleaved,
    }


def _rotated(array: np.ndarray) -> np.ndarray:
    """Negate the second half of every head (the last axis): its own inverse (module docstring)."""
    half = array.shape[-1] // 2
    return np.concatenate([array[..., :half], -array[..., half:]], axis=-1)


def _specs(cfg: ModelConfig, variant: GPTVariant | None) -> dict:
    return variant.specs(cfg) if variant else param_specs(cfg)


def _entries(cfg: ModelConfig, variant: GPTVariant | None) -> Iterator[Entry]:
    """Every tensor of nanochat's state dict for this model but the padded vocabulary tables and a
    variant's gates."""
    specs = spec_leaves(_specs(cfg, variant))
    for i in range(cfg.num_layers):
        for path, key in LAYER_KEYS.items():
            spec = specs[("layers", *path)]
            yield f"transformer.h.{i}.{key}", ("layers", *path), i, spec.shape[1:], spec.in_dims
        if variant:
            yield from variant.layer_entries(cfg, specs, i)
    if cfg.value_embeds and not variant:
        gate = specs[("layers", "self_attn", "ve_gate")]
        for i in cfg.value_embed_layers:
            yield f"transformer.h.{i}.{VE_GATE}", ("layers", "self_attn", "ve_gate"), i, gate.shape[1:], 1
    if cfg.resid_scalars:
        for name in ("resid_lambdas", "x0_lambdas"):
            yield name, (name,), None, specs[(name,)].shape, 0
    for path, key in KARPATHY_SCALARS.items():
        if path in specs:
            yield key, path, None, specs[path].shape, specs[path].in_dims
    if variant:
        yield from variant.entries(cfg, specs)


def _value_embed_keys(cfg: ModelConfig, variant: GPTVariant | None) -> list[str]:
    """The value embeddings' keys, in the order of params["value_embeds"] (a variant's own)."""
    key = variant.value_embeds if variant else "value_embeds.{i}.weight"
    return [key.format(i=i) for i in cfg.value_embed_layers]


def _vocab_tables(cfg: ModelConfig, variant: GPTVariant | None) -> dict[str, tuple[int, ...]]:
    """nanochat's padded vocabulary tables (keys and shapes): the embedding, the head and the value
    embeddings, each [V', ...]."""
    padded, kv = padded_vocab(cfg.vocab_size), cfg.num_kv_heads * cfg.head_dim
    tables = {
        "transformer.wte.weight": (padded, cfg.hidden_size),
        "lm_head.weight": (padded, cfg.hidden_size),
    }
    return tables | {key: (padded, kv) for key in _value_embed_keys(cfg, variant)}


def from_nanochat_state(cfg: ModelConfig, state: dict[str, np.ndarray], *, interleaved: bool = False) -> dict:
    """Our params of a nanochat GPT state dict (with `interleaved`, the LRT release's recurrent GPT: our
    LRT's, params["lrt"] included); strict: every missing, unexpected or misshapen key is listed in one
    error."""
    state = {key.removeprefix("_orig_mod."): value for key, value in state.items()}  # torch.compile's prefix
    variant = variant_of({INTERLEAVED: interleaved})
    entries = list(_entries(cfg, variant))
    expected = _vocab_tables(cfg, variant) | (variant.gates(cfg) if variant else {})
    expected |= {key: torch_shape(shape, in_dims) for key, _, _, shape, in_dims in entries}
    if cfg.smear_channels is not None and not set(KARPATHY_SCALARS.values()) & set(state):
        refuse(
            ["no smear / backout weights: karpathy/nanochat's GPT from before them (only 92d63d4's imports)"],
            "this nanochat state dict",
        )
    problems = [f"missing key {k}" for k in expected if k not in state]
    problems += [f"unexpected key {k}" for k in sorted(set(state) - set(expected))]
    problems += [
        f"{k}: shape {tuple(state[k].shape)}, expected {shape}"
        for k, shape in expected.items()
        if k in state and tuple(state[k].shape) != shape
    ]
    refuse(problems, "this nanochat state dict")
    v = cfg.vocab_size
    params = jax.tree.map(
        lambda spec: np.zeros(spec.shape, np.float32), _specs(cfg, variant), is_leaf=is_spec
    )
    for key, path, block, shape, in_dims in entries:
        array = from_torch(np.asarray(state[key]), shape, in_dims)
        array = _rotated(array) if path[-1] in ROTATED else array
        target = _at(params, path[:-1])
        if block is None:
            target[path[-1]] = array
        else:
            target[path[-1]][block] = array
    params["embed_tokens"] = state["transformer.wte.weight"][:v]
    params["lm_head"] = state["lm_head.weight"][:v].T
    for j, key in enumerate(_value_embed_keys(cfg, variant)):
        params["value_embeds"][j] = state[key][:v].reshape(params["value_embeds"].shape[1:])
    if variant:
        variant.read_gates(cfg, state, params)
    return jax.tree.map(lambda a: jnp.asarray(np.asarray(a).astype(cfg.param_dtype)), params)


def to_nanochat_state(cfg: ModelConfig, params: dict) -> dict[str, np.ndarray]:
    """nanochat's GPT state dict of our params (the vocabulary tables padded with zero rows); params with
    a variant's entry (params["lrt"]: our LRT with per-layer feedback, both paths) are that variant's GPT
    (the LRT release's recurrent GPT)."""
    variant = variant_held(params)
    check_params(cfg, {k: v for k, v in params.items() if not variant or k != variant.params_key})
    params = jax.tree.map(np.asarray, params)
    padded = padded_vocab(cfg.vocab_size)
    pad = lambda a: np.concatenate([a, np.zeros((padded - a.shape[0], *a.shape[1:]), a.dtype)])
    state = {
        "transformer.wte.weight": pad(params["embed_tokens"]),
        "lm_head.weight": pad(params["lm_head"].T),
    }
    for key, path, block, _, in_dims in _entries(cfg, variant):
        array = _at(params, path) if block is None else _at(params, path)[block]
        state[key] = to_torch(_rotated(array) if path[-1] in ROTATED else array, in_dims)
    for j, key in enumerate(_value_embed_keys(cfg, variant)):
        state[key] = pad(params["value_embeds"][j].reshape(cfg.vocab_size, -1))
    if variant:
        variant.write_gates(cfg, params, state)
    return state


def _at(tree: dict, path: tuple[str, ...]):
    for name in path:
        tree = tree[name]
    return tree


def gpt_config(path: Path | str) -> dict:
    """The GPTConfig fields the checkpoint folder's largest step records."""
    _, meta = checkpoint_files(path) or _no_checkpoint(path)
    return read_json(meta)["model_config"]


def nanochat_config(path: Path | str, *, param_dtype: str = "float32") -> ModelConfig:
    """The ModelConfig of the checkpoint folder's largest step, read without the weights."""
    return model_config_from_nanochat(gpt_config(path), param_dtype=param_dtype)


def load_nanochat(
    path: Path | str, *, param_dtype: str = "float32", progress: bool = False
) -> tuple[ModelConfig, dict]:
    """(our backbone's ModelConfig, params) of the folder's largest step; an interleaved model's params
    carry our LRT's feedback as params["lrt"] (its architecture: lrt with per-layer feedback, both paths)."""
    model_file, _ = checkpoint_files(path) or _no_checkpoint(path)
    gpt = gpt_config(path)
    cfg = model_config_from_nanochat(gpt, param_dtype=param_dtype)
    interleaved = bool(gpt.get(INTERLEAVED))
    state = {key: torch_to_numpy(value).astype(np.float32) for key, value in torch_state(model_file).items()}
    return cfg, from_nanochat_state(cfg, state, interleaved=interleaved)


def save_nanochat(
    cfg: ModelConfig, params: dict, path: Path | str, *, step: int = 0, overwrite: bool = False, **meta
) -> None:
    """model_<step>.pt and meta_<step>.json as nanochat's checkpoint_manager writes them (its build_model
    loads the folder); `meta` adds fields beside "model_config". Checked before anything is written."""
    import torch

    check_export_target(path, overwrite=overwrite)
    gpt = nanochat_gpt_config(cfg, interleaved=variant_held(params) is not None)
    state = {
        key: numpy_to_torch(np.ascontiguousarray(value))
        for key, value in to_nanochat_state(cfg, params).items()
    }
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    torch.save(state, path / f"model_{step:06d}.pt")
    (path / f"meta_{step:06d}.json").write_text(
        json.dumps({"model_config": gpt, "step": step, **meta}, indent=2)
    )


def _no_checkpoint(path: Path | str):
    raise ValueError(
        f"{path}: not a nanochat checkpoint folder (no model_<step>.pt with its meta_<step>.json)"
    )


def read_config(path: Path | str, *, param_dtype: str = "float32") -> ModelConfig:
    """`nanochat_config`, after the weight file's header is checked (a file that would fail to load)."""
    model_file, meta = checkpoint_files(path) or _no_checkpoint(path)
    torch_state(model_file, mmap=True)
    with naming(meta):
        return nanochat_config(path, param_dtype=param_dtype)


def reference(path: Path):
    from t2mlr_jax.formats.nanochat_torch import NanochatReference

    return NanochatReference.from_checkpoint(path)


def refuses_checkpoint(path: Path) -> str | None:
    variant = variant_of(gpt_config(path))
    return variant.refusal if variant else None


def export(cfg: ModelConfig, params: dict, path: Path | str, *, overwrite: bool = False, **_) -> None:
    """`save_nanochat` as an export: its tokenizer lives in nanochat's base dir, not in a checkpoint."""
    save_nanochat(cfg, params, path, overwrite=overwrite)


register_format(
    CheckpointFormat(
        "nanochat",
        recognises=is_nanochat_checkpoint,
        read_config=read_config,
        load=load_nanochat,
        save=export,
        refuses_model=holds_no_recurrence("nanochat"),
        refuses_checkpoint=refuses_checkpoint,
        backbone_only=True,
        torch_model=reference,
        priority=RELEASE,
        described="a nanochat checkpoint (model_<step>.pt with its meta_<step>.json)",
    )
)
