"""The states and probes of experiments/future_token_probe.py: each model's residual stream after every
block (T²MLR's under the exact recurrence) at the probed positions, and the (layer, k) MLP probes of the
token k ahead, trained together and scored on held-out rows."""

from __future__ import annotations

import functools
import math
import sys
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, Bool, Float, Int
from tqdm import tqdm

from t2mlr_jax.architectures.t2mlr.fusion import fuse
from t2mlr_jax.architectures.t2mlr.recurrence import decode_step
from t2mlr_jax.model.backbone import embed, init_cache
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.token_layout import Layout, layout_blocks, scan_over_tokens, shift_right


class ProbeSettings(NamedTuple):
    hidden: int  # the probe's hidden width
    steps: int  # Adam steps
    batch: int  # positions per step
    lr: float


class ProbeData(NamedTuple):
    """The probed positions, shared by every model: position `times[n]` of token row `rows[n]`."""

    rows: Int[np.ndarray, " N"]
    times: Int[np.ndarray, " N"]
    labels: Int[np.ndarray, "K N"]  # class of x_{t+k}; len(classes) ("other") outside the probe's classes
    test: Bool[np.ndarray, " N"]  # held-out rows
    classes: Int[np.ndarray, " C"]  # the token id of each class


# ---------------------------------------------------------------------------------------------- states


def exact_caches(
    cfg: ModelConfig, params: dict, tokens: Int[Array, "B T"], layout: Layout
) -> Float[Array, "B T D"]:
    """The cache each token is fused with under the exact recurrence, R_{t-1} (zeros at a document start):
    exact_forward's scan of decode_step, keeping every token's R_t."""
    b, t = tokens.shape

    def step(carry, token, token_layout):
        out = decode_step(cfg, params, token, *carry, token_layout)
        return (out.recurrent_state, out.cache), out.recurrent_state

    start = (jnp.zeros((b, cfg.hidden_size), cfg.dtype), init_cache(cfg, b, t))
    _, caches = scan_over_tokens(step, start, tokens, layout)
    return shift_right(caches, layout.positions)


def layer_states(
    cfg: ModelConfig, params: dict, tokens: Int[Array, "B T"], layout: Layout
) -> Float[Array, "L B T D"]:
    """The residual stream after every block (before the final norm) at every position. For T²MLR, the
    states of the exact recurrence: token t's states depend on earlier tokens' states and on R_{t-1} only,
    so one parallel pass with the exact caches fused at l_start computes them all."""
    l_start = cfg.layer_range[0] if cfg.recurrence is not None else None
    caches = exact_caches(cfg, params, tokens, layout) if l_start is not None else None
    h, states = embed(cfg, params, tokens), []
    for block in range(cfg.num_layers):  # one block per call: each block's output is kept
        if block == l_start:
            h, _ = fuse(cfg, params["mixer"], h, caches, layout.control_flow, layout.positions)
        h, _ = layout_blocks(cfg, params, h, block, block + 1, layout, tokens)
        states.append(h)
    return jnp.stack(states)


# Compiled once per model config and chunk shape (static: the config), shared by every call.
jitted_layer_states = jax.jit(layer_states, static_argnums=0)


# ---------------------------------------------------------------------------------------------- probes


def probe_data(
    tokens: Int[np.ndarray, "B T"],
    segment_ids: Int[np.ndarray, "B T"],
    ks: tuple[int, ...],
    num_classes: int,
    test_fraction: float,
    seed: int,
) -> ProbeData:
    """Positions t whose x_{t+max k} lies in t's document; rows split at random into train / held-out; the
    `num_classes` most frequent targets of the training positions (over every k) as the probe's classes."""
    span = max(ks)
    inside = (segment_ids[:, :-span] != 0) & (segment_ids[:, span:] == segment_ids[:, :-span])
    rows, times = np.nonzero(inside)
    count = max(1, round(test_fraction * len(tokens)))
    held_out = np.random.default_rng(seed).permutation(len(tokens))[:count]
    test = np.isin(rows, held_out)
    targets = np.stack([tokens[rows, times + k] for k in ks])
    ids, counts = np.unique(targets[:, ~test], return_counts=True)
    classes = ids[np.argsort(-counts, kind="stable")[:num_classes]]
    lookup = np.full(int(tokens.max()) + 1, len(classes))
    lookup[classes] = np.arange(len(classes))
    return ProbeData(rows, times, lookup[targets], test, classes)


def _probe_logits(p: dict, x):
    """One probe: [B, D] -> [B, C]."""
    return jax.nn.relu(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]


# Every (layer, k) probe at once: params [L, K, ...]; a layer's input is shared by its K probes.
_grid_logits = jax.vmap(jax.vmap(_probe_logits, in_axes=(0, None)), in_axes=(0, 0))


def _nll(logits, labels):
    return optax.softmax_cross_entropy_with_integer_labels(
        logits, jnp.broadcast_to(labels, logits.shape[:-1])
    )


@functools.cache
def _probe_functions(settings: ProbeSettings, num_classes: int):
    """(init, train step, evaluation) for the settings, jitted: one step trains every (layer, k) probe."""
    optimizer = optax.adam(settings.lr)

    def init(key, layers, ks, d):
        def one(key):
            k1, k2 = jax.random.split(key)
            return {
                "w1": jax.random.normal(k1, (d, settings.hidden)) / math.sqrt(d),
                "b1": jnp.zeros(settings.hidden),
                "w2": jax.random.normal(k2, (settings.hidden, num_classes)) / math.sqrt(settings.hidden),
                "b2": jnp.zeros(num_classes),
            }

        params = jax.vmap(jax.vmap(one))(jax.random.split(key, (layers, ks)))
        return params, optimizer.init(params)

    def loss(params, x, labels):
        return _nll(_grid_logits(params, x), labels).mean(-1).sum()  # independent probes: a sum of means

    @jax.jit
    def train_step(params, opt_state, x, labels, key):
        pick = jax.random.randint(key, (settings.batch,), 0, x.shape[1])
        grads = jax.grad(loss)(params, x[:, pick], labels[:, pick])
        updates, opt_state = optimizer.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state

    @jax.jit
    def evaluate(params, x, labels, valid):
        logits = _grid_logits(params, x)
        hit = (jnp.argmax(logits, -1) == labels) & (labels < num_classes - 1) & valid  # "other" never hits
        return hit.sum(-1), (_nll(logits, labels) * valid).sum(-1)

    return jax.jit(init, static_argnums=(1, 2, 3)), train_step, evaluate


def fit_probes(
    features: Float[np.ndarray, "L N D"], data: ProbeData, settings: ProbeSettings, seed: int, desc: str
) -> dict:
    """Train the (layer, k) probes on the training positions of `features` (the states at data.rows /
    data.times) and score them on the held-out ones: {"accuracy", "loss"}, each [L, K]."""
    train_x, test_x = features[:, ~data.test], features[:, data.test]
    mean, std = train_x.mean(1, keepdims=True), train_x.std(1, keepdims=True) + 1e-6  # per layer and channel
    train_x, test_x = (train_x - mean) / std, (test_x - mean) / std
    train_y, test_y = data.labels[:, ~data.test], data.labels[:, data.test]
    init, train_step, evaluate = _probe_functions(settings, len(data.classes) + 1)
    key = jax.random.key(seed)
    params, opt_state = init(key, features.shape[0], len(data.labels), features.shape[-1])
    train_x, train_y = jnp.asarray(train_x), jnp.asarray(train_y)
    for step in tqdm(range(settings.steps), desc=desc, file=sys.stderr, leave=False):
        params, opt_state = train_step(params, opt_state, train_x, train_y, jax.random.fold_in(key, step))
    hits, nll = 0, 0
    for start in range(0, test_x.shape[1], settings.batch):  # fixed-size chunks: one compiled evaluation
        pick = np.arange(start, start + settings.batch)
        valid = pick < test_x.shape[1]
        pick = np.where(valid, pick, 0)
        chunk_hits, chunk_nll = evaluate(params, test_x[:, pick], test_y[:, pick], valid)
        hits, nll = hits + np.asarray(chunk_hits), nll + np.asarray(chunk_nll)
    return {"accuracy": hits / test_x.shape[1], "loss": nll / test_x.shape[1]}
