"""The LRT release's interleaved (recurrent) GPT in nanochat's checkpoint format (t2mlr_jax.formats.nanochat,
its `GPTVariant` use_interleaved, registered when this package is imported).

It is our LRT with per-layer feedback on both paths (its sequential inference is our exact recurrence):
interleaved_projections / interleaved_key_projections are params["lrt"]["v_fb" / "k_fb"],
interleaved_lambdas its gamma, the init value embeddings our value embeddings on every layer, and each
triple gate [3K, C] splits into our (local, feedback) gate and the value embeddings' gate.
"""

from __future__ import annotations

import numpy as np

from t2mlr_jax.architectures.lrt.forward import LRTConfig, lrt_specs
from t2mlr_jax.formats.nanochat import INTERLEAVED, VARIANTS, GPTVariant
from t2mlr_jax.model.config import ModelConfig

FEEDBACK_KEYS = {
    ("lrt", "v_fb"): "interleaved_projections.{i}.W_v.weight",
    ("lrt", "k_fb"): "interleaved_key_projections.{i}.W_v.weight",
}
TRIPLE_GATE = "transformer.h.{i}.attn.triple_gate.weight"


def layer_entries(cfg: ModelConfig, specs: dict, i: int):
    for path, key in FEEDBACK_KEYS.items():
        yield key.format(i=i), path, i, specs[path].shape[1:], 1


def entries(cfg: ModelConfig, specs: dict):
    yield "interleaved_lambdas", ("lrt", "gamma"), None, specs[("lrt", "gamma")].shape, 0


def triple_gates(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """The triple gates [3K, C] (local, feedback, value embedding), by key."""
    shape = (3 * cfg.num_kv_heads, cfg.gate_channels)
    return {TRIPLE_GATE.format(i=i): shape for i in range(cfg.num_layers)}


def read_gates(cfg: ModelConfig, state: dict, params: dict) -> None:
    """[3K, C] -> ours (local, feedback) | the value embeddings'."""
    for i, key in enumerate(triple_gates(cfg)):
        gate = np.asarray(state[key]).T
        params["lrt"]["gate"][i] = gate[:, : 2 * cfg.num_kv_heads]
        params["layers"]["self_attn"]["ve_gate"][i] = gate[:, 2 * cfg.num_kv_heads :]


def write_gates(cfg: ModelConfig, params: dict, state: dict) -> None:
    for i, key in enumerate(triple_gates(cfg)):
        gate = np.concatenate([params["lrt"]["gate"][i], params["layers"]["self_attn"]["ve_gate"][i]], axis=1)
        state[key] = np.ascontiguousarray(gate.T)


VARIANTS.register(
    INTERLEAVED,
    GPTVariant(
        params_key="lrt",
        specs=lambda cfg: lrt_specs(LRTConfig(cfg)),
        layer_entries=layer_entries,
        entries=entries,
        value_embeds="interleaved_init_value_embeds.{i}.weight",
        gates=triple_gates,
        read_gates=read_gates,
        write_gates=write_gates,
        refusal="the LRT release's interleaved (recurrent) GPT, our LRT, which an orbax model checkpoint "
        "cannot hold: train or evaluate it with arch=lrt and --config.init_from (model.ve_every_layer=True)",
    ),
)
