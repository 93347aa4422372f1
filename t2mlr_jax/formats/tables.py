"""Conversion tables: one list of `Rule`s per PyTorch layout, used for both import and export (a system's
release layout adds its own rules: T²MLR's mixer keys, t2mlr_jax.architectures.t2mlr).

A rule pairs one of our parameters (a path in the params pytree) with a PyTorch state-dict key.
Our weights are stored [in..., out...] (q_proj is [D, H, E]); PyTorch Linear weights are
[out, in]. The parameter's spec says how many leading dimensions (after the stacked layer axis) are
the Linear's input (`ParamSpec.in_dims`), which is all a transform needs: flatten to [in, out],
transpose. Parameters with `in_dims=0` are copied as they are (embeddings, norms, biases, gammas).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.params import param_specs
from t2mlr_jax.model.spec import is_spec, spec_leaves


@dataclasses.dataclass(frozen=True)
class Rule:
    path: tuple[str, ...]
    key: str  # `{block}`: the block index of a stacked per-layer parameter; `{l_start}`: the fused block

    @property
    def stacked(self) -> bool:
        return self.path[0] == "layers"


LLAMA_RULES = (
    Rule(("embed_tokens",), "model.embed_tokens.weight"),
    Rule(("layers", "input_layernorm"), "model.layers.{block}.input_layernorm.weight"),
    Rule(("layers", "self_attn", "q_proj"), "model.layers.{block}.self_attn.q_proj.weight"),
    Rule(("layers", "self_attn", "k_proj"), "model.layers.{block}.self_attn.k_proj.weight"),
    Rule(("layers", "self_attn", "v_proj"), "model.layers.{block}.self_attn.v_proj.weight"),
    Rule(("layers", "self_attn", "o_proj"), "model.layers.{block}.self_attn.o_proj.weight"),
    Rule(("layers", "post_attention_layernorm"), "model.layers.{block}.post_attention_layernorm.weight"),
    Rule(("layers", "mlp", "gate_proj"), "model.layers.{block}.mlp.gate_proj.weight"),
    Rule(("layers", "mlp", "up_proj"), "model.layers.{block}.mlp.up_proj.weight"),
    Rule(("layers", "mlp", "down_proj"), "model.layers.{block}.mlp.down_proj.weight"),
    Rule(("norm",), "model.norm.weight"),
    Rule(("lm_head",), "lm_head.weight"),
)
# Qwen3 is Llama plus QK-norm scales, Gemma3 adds the sandwich norms (our names are HF Gemma's);
# `select_rules` keeps the rules of the parameters a model has.
HF_RULES = (
    *LLAMA_RULES,
    Rule(("layers", "self_attn", "q_norm"), "model.layers.{block}.self_attn.q_norm.weight"),
    Rule(("layers", "self_attn", "k_norm"), "model.layers.{block}.self_attn.k_norm.weight"),
    Rule(("layers", "pre_feedforward_layernorm"), "model.layers.{block}.pre_feedforward_layernorm.weight"),
    Rule(("layers", "post_feedforward_layernorm"), "model.layers.{block}.post_feedforward_layernorm.weight"),
)


@dataclasses.dataclass(frozen=True)
class StateDictLayout:
    """The rules of one PyTorch layout for one model, and how its keys are spelled."""

    name: str
    cfg: ModelConfig  # the model whose parameters these rules cover (an HF export has no mixer)
    rules: tuple[Rule, ...]
    prefix: str = ""
    wrapped_block: int | None = None  # the release wraps block l_start: its keys gain `.model`

    def key(self, rule: Rule, block: int | None = None) -> str:
        spelled = f"{block}.model" if block is not None and block == self.wrapped_block else str(block)
        return self.prefix + rule.key.format(block=spelled, l_start=self.wrapped_block)

    @property
    def head_key(self) -> str:
        return self.prefix + "lm_head.weight"

    @property
    def embed_key(self) -> str:
        return self.prefix + "model.embed_tokens.weight"


def select_rules(name: str, cfg: ModelConfig, rules, **layout) -> StateDictLayout:
    """The rules for the parameters this model has; every parameter must have one."""
    paths = spec_leaves(param_specs(cfg))
    chosen = tuple(r for r in rules if r.path in paths)
    uncovered = set(paths) - {r.path for r in chosen}
    if uncovered:
        raise ValueError(
            f"layout {name!r} has no key for parameters {sorted('/'.join(p) for p in uncovered)}"
        )
    return StateDictLayout(name, cfg, chosen, **layout)


def hf_layout(cfg: ModelConfig) -> StateDictLayout:
    """transformers' LlamaForCausalLM / Qwen3ForCausalLM / Gemma3ForCausalLM state dict (the backbone: a
    T²MLR model's mixer is not part of it)."""
    return select_rules("hf", cfg.replace(recurrence=None), HF_RULES)


def torch_shape(shape: tuple[int, ...], in_dims: int) -> tuple[int, ...]:
    return (math.prod(shape[in_dims:]), math.prod(shape[:in_dims])) if in_dims else shape


def to_torch(array: np.ndarray, in_dims: int) -> np.ndarray:
    if not in_dims:
        return array
    return np.ascontiguousarray(array.reshape(torch_shape(array.shape, in_dims)[::-1]).T)


def from_torch(weight: np.ndarray, shape: tuple[int, ...], in_dims: int) -> np.ndarray:
    return (weight.T if in_dims else weight).reshape(shape)


def _entries(layout: StateDictLayout):
    """(key, rule, block, per-key shape in our layout, fan-in dims) for every key of the layout."""
    cfg = layout.cfg
    specs = spec_leaves(param_specs(cfg))
    for rule in layout.rules:
        spec = specs[rule.path]
        if rule.stacked:
            for block in range(cfg.num_layers):
                yield layout.key(rule, block), rule, block, spec.shape[1:], spec.in_dims
        else:
            yield layout.key(rule), rule, None, spec.shape, spec.in_dims


def _lookup(tree: dict, path: tuple[str, ...]):
    for name in path:
        tree = tree[name]
    return tree


def check_params(cfg: ModelConfig, params: dict) -> None:
    """Params must match the parameter table exactly: one ValueError naming every difference."""
    specs = spec_leaves(param_specs(cfg))
    got = {tuple(k.key for k in path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}
    problems = [f"missing {'/'.join(p)}" for p in sorted(set(specs) - set(got))]
    problems += [f"unexpected {'/'.join(p)}" for p in sorted(set(got) - set(specs))]
    problems += [
        f"{'/'.join(p)}: shape {tuple(got[p].shape)}, expected {specs[p].shape}"
        for p in sorted(set(specs) & set(got))
        if tuple(got[p].shape) != specs[p].shape
    ]
    if problems:
        raise ValueError("params do not match the model config:\n  - " + "\n  - ".join(problems))


def to_state_dict(layout: StateDictLayout, params: dict, *, progress: bool = False) -> dict[str, np.ndarray]:
    """Our params as a PyTorch state dict of numpy arrays ([out, in] Linear weights), dtypes kept."""
    check_params(layout.cfg, params)
    state = {}
    for key, rule, block, _, in_dims in tqdm(
        list(_entries(layout)), desc=f"export {layout.name}", disable=not progress
    ):
        array = np.asarray(_lookup(params, rule.path))
        state[key] = to_torch(array if block is None else array[block], in_dims)
    return state


def from_state_dict(
    layout: StateDictLayout, state: Mapping[str, np.ndarray], *, progress: bool = False
) -> dict:
    """Our params (jax arrays) from a PyTorch state dict; strict: one ValueError lists every missing or
    unexpected key and every shape mismatch. A tied model may carry a copy of the embedding as lm_head."""
    cfg = layout.cfg
    entries = list(_entries(layout))
    expected = {key: shape for key, _, _, shape, _ in entries}
    problems = [f"missing key {k}" for k in expected if k not in state]
    extra = set(state) - set(expected)
    if cfg.tie_embeddings and layout.head_key in extra and layout.embed_key in state:
        extra.discard(layout.head_key)
        if not np.array_equal(state[layout.head_key], state[layout.embed_key]):
            problems.append(
                f"{layout.head_key} differs from {layout.embed_key} in a model with tied embeddings"
            )
    problems += [f"unexpected key {k}" for k in sorted(extra)]
    problems += [
        f"{key}: shape {tuple(state[key].shape)}, expected {torch_shape(shape, in_dims)}"
        for key, _, _, shape, in_dims in entries
        if key in state and tuple(state[key].shape) != torch_shape(shape, in_dims)
    ]
    if problems:
        raise ValueError(
            f"checkpoint does not match the {layout.name!r} layout of this model config "
            f"({len(problems)} problems):\n  - " + "\n  - ".join(problems)
        )
    arrays: dict[tuple[str, ...], list] = {rule.path: [] for rule in layout.rules}
    for key, rule, _, shape, in_dims in tqdm(entries, desc=f"import {layout.name}", disable=not progress):
        arrays[rule.path].append(from_torch(np.asarray(state[key]), shape, in_dims))

    def leaf(path, spec):
        path = tuple(k.key for k in path)
        array = np.stack(arrays[path]) if path[0] == "layers" else arrays[path][0]
        return jnp.asarray(array.astype(spec.dtype or cfg.param_dtype))

    # Mapping over the parameter table keeps its exact structure (a mixer without parameters stays {}).
    return jax.tree_util.tree_map_with_path(leaf, param_specs(cfg), is_leaf=is_spec)
