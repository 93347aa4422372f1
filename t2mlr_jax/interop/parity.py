"""Number-for-number parity of an imported nanochat model (karpathy/nanochat, the LRT release) with the
release's own outputs, shared by tests/interop/test_nanochat_release.py and tools/release_parity.py.

The release's side is a dict in the layout experiments/make_nanochat_fixture.py writes to release.npz:
  logits       its forward on `tokens` [B, T, V]
  loss         mean next-token cross-entropy of a forward on tokens[:, :-1] against tokens[:, 1:]
  grad:<key>   that loss's gradient for every tensor of its state dict, by key
  decode       its KV-cached decode: a prefill, then one token per call (teacher forced) [B, T, V]
`our_outputs` computes ours in the same layout (the gradients mapped to the release's keys, and padded,
by `to_nanochat_state`); `compare` gives the figures and the pass / fail of each against TOLERANCES;
`compare_states` checks an export's state dict against the release's, bitwise.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from t2mlr_jax.architectures.lrt_forward import LRTConfig, LRTDecoder
from t2mlr_jax.architectures.lrt_forward import exact_forward as lrt_exact
from t2mlr_jax.interop.files import read_json, torch_state, torch_to_numpy
from t2mlr_jax.interop.nanochat import padded_vocab, save_nanochat, to_nanochat_state
from t2mlr_jax.interop.pretrained import load_pretrained
from t2mlr_jax.model import backbone
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.generate import T2MLRDecoder, teacher_forced
from t2mlr_jax.model.recurrence import make_layout

GRAD = "grad:"  # the prefix of a gradient's key
# Logits are compared relative to the largest |logit|, as tools/convert_checkpoint.py --verify does: fp32
# summation order alone moves a 12-layer, 768-wide model's logits by ~1e-5 (the release's own cached
# decode and forward differ by 1.4e-5 there, and a float64 run of it is 1.2e-5 from either side).
TOLERANCES = {
    "logits": 1e-5,  # max |Δ logits| / max |logit|
    "loss": 1e-5,  # |Δ loss|
    "gradients": 1e-4,  # max over keys of max |Δ| / max |release grad|
    "zero_gradients": 1e-10,  # max |Δ| of a key whose release gradient is all zero
    "decode": 1e-5,  # max |Δ| of the cached decode's logits / max |logit|
}
# nanochat's padded tables: embedding, head, value embeddings (the interleaved model's init ones)
VOCAB_TABLES = ("transformer.wte.weight", "lm_head.weight", "value_embeds.", "interleaved_init_value_embeds.")


@functools.partial(jax.jit, static_argnums=0)
def loss_and_grads(cfg: ModelConfig, params: dict, tokens: jax.Array) -> tuple[jax.Array, dict]:
    """The release's training loss (mean next-token cross-entropy of a forward on tokens[:, :-1]) and its
    gradient with respect to every parameter."""

    def loss(params):
        logits = backbone.forward(cfg, params, tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    return jax.value_and_grad(loss)(params)


def our_outputs(cfg: ModelConfig, params: dict, tokens, prefill: int) -> dict[str, np.ndarray]:
    """Our logits, loss, gradients (by the release's keys) and cached decode on `tokens`, in the layout
    of the release's (module docstring). The interleaved GPT (params with "lrt": our LRT): its exact
    recurrence's logits and its cached decode, which the release's sequential inference is."""
    tokens = jnp.asarray(tokens)
    if "lrt" in params:
        lrt = LRTConfig(cfg)
        exact = lrt_exact(lrt, params, tokens, make_layout(tokens)).logits
        decode = teacher_forced(LRTDecoder(lrt), (params, {}), tokens, prefill)
        return {"logits": np.asarray(exact), "decode": np.asarray(decode)}
    out = {"logits": np.asarray(backbone.forward(cfg, params, tokens))}
    loss, grads = loss_and_grads(cfg, params, tokens)
    out["loss"] = np.asarray(loss)
    out |= {GRAD + key: value for key, value in to_nanochat_state(cfg, grads).items()}
    del grads
    out["decode"] = np.asarray(teacher_forced(T2MLRDecoder(cfg), params, tokens, prefill))
    return out


def max_abs_diff(a, b) -> float:
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())


def compare(ours: Mapping[str, np.ndarray], theirs: Mapping[str, np.ndarray]) -> dict:
    """The figures of ours against the release's (both in the module docstring's layout; `theirs` may be
    an open np.load, read a key at a time) and whether each is within TOLERANCES. A recurrent release
    model has only its sequential logits, which are also its decode: no loss or gradient figures."""
    logits = max_abs_diff(ours["logits"], theirs["logits"])
    scale = float(np.abs(theirs["logits"]).max())
    their_decode = theirs["decode"] if "decode" in theirs else theirs["logits"]
    decode = max_abs_diff(ours["decode"], their_decode)
    checked = ("logits", "loss", "gradients", "decode") if "loss" in theirs else ("logits", "decode")
    figures = {
        "logits": {
            "max_abs_diff": logits,
            "max_abs_logit": scale,
            "relative": logits / scale,
            "tolerance": TOLERANCES["logits"],
            "passed": logits <= TOLERANCES["logits"] * scale,
        },
        "decode": {
            "max_abs_diff": decode,
            "relative": decode / scale,
            # the release against itself, for scale: its cached decode vs its forward, both fp32
            "release_decode_vs_forward": max_abs_diff(their_decode, theirs["logits"]),
            "tolerance": TOLERANCES["decode"],
            "passed": decode <= TOLERANCES["decode"] * scale,
        },
    }
    if "loss" in theirs:
        figures |= loss_and_gradient_figures(ours, theirs)
    figures["passed"] = all(figures[name]["passed"] for name in checked)
    return figures


def loss_and_gradient_figures(ours: Mapping[str, np.ndarray], theirs: Mapping[str, np.ndarray]) -> dict:
    """compare's loss and gradient figures (a model the release trains by gradient)."""
    loss = abs(float(ours["loss"]) - float(theirs["loss"]))
    our_keys = {k.removeprefix(GRAD) for k in ours if k.startswith(GRAD)}
    their_keys = {k.removeprefix(GRAD) for k in theirs if k.startswith(GRAD)}
    relative, zero = {}, {}
    for key in sorted(our_keys & their_keys):
        theirs_grad = np.asarray(theirs[GRAD + key])
        diff = max_abs_diff(ours[GRAD + key], theirs_grad)
        top = float(np.abs(theirs_grad).max())
        if top == 0:
            zero[key] = diff
        else:
            relative[key] = diff / top
    worst = max(relative, key=relative.get, default=None)
    grads = {
        "keys": len(our_keys | their_keys),
        "missing": sorted(their_keys - our_keys),  # in the release's, not in ours
        "unexpected": sorted(our_keys - their_keys),
        "max_relative_diff": relative[worst] if worst else 0.0,
        "worst_key": worst,
        "tolerance": TOLERANCES["gradients"],
        "zero_keys": zero,  # key -> max |Δ| where the release's gradient is all zero
        "zero_tolerance": TOLERANCES["zero_gradients"],
    }
    grads["passed"] = (
        not grads["missing"]
        and not grads["unexpected"]
        and grads["max_relative_diff"] <= TOLERANCES["gradients"]
        and all(diff <= TOLERANCES["zero_gradients"] for diff in zero.values())
    )
    return {
        "loss": {
            "ours": float(ours["loss"]),
            "release": float(theirs["loss"]),
            "abs_diff": loss,
            "tolerance": TOLERANCES["loss"],
            "passed": loss <= TOLERANCES["loss"],
        },
        "gradients": grads,
    }


def is_vocab_table(key: str) -> bool:
    return key.startswith(VOCAB_TABLES)


def compare_states(vocab_size: int, theirs: Mapping[str, np.ndarray], ours: Mapping[str, np.ndarray]) -> dict:
    """An export's nanochat state dict (`ours`) against the release's: the same keys and shapes, every
    tensor bitwise equal but the vocabulary tables' padded rows (>= vocab_size), which ours writes as
    zeros where the release keeps what it drew."""
    differing = sorted(
        key
        for key in set(theirs) & set(ours)
        if np.shape(ours[key]) != np.shape(theirs[key])
        or not np.array_equal(
            *(np.asarray(s[key])[:vocab_size] if is_vocab_table(key) else s[key] for s in (ours, theirs))
        )
    )
    padded = sorted(key for key in ours if is_vocab_table(key) and np.shape(ours[key])[0] > vocab_size)
    padded_rows = padded_vocab(vocab_size) - vocab_size
    figures = {
        "keys": len(theirs),
        "missing": sorted(set(theirs) - set(ours)),
        "unexpected": sorted(set(ours) - set(theirs)),
        "differing": differing,
        "padded_rows": padded_rows,  # per vocabulary table: rows vocab_size .. padded_vocab - 1
        "padded_tables": padded,
        "padded_rows_zero": all(not np.asarray(ours[key])[vocab_size:].any() for key in padded),
    }
    figures["bitwise"] = not (figures["missing"] or figures["unexpected"] or differing)
    return figures


# tools/release_parity.py's hooks for the LRT release (its Release.interop): steps 2 and 3 on a size's folder.


def release_config(folder: Path) -> dict:
    """The GPTConfig the release's checkpoint records."""
    return read_json(folder / "release" / "model" / "meta_000000.json")["model_config"]


def our_side(folder: Path, prefill: int) -> tuple:
    """Step 2: the release's checkpoint imported through ours; (cfg, params, compare's figures)."""
    cfg, params = load_pretrained(folder / "release" / "model")
    with np.load(folder / "release" / "release.npz") as theirs:
        figures = compare(our_outputs(cfg, params, theirs["tokens"], prefill), theirs)
    return cfg, params, figures


def export_side(folder: Path, cfg: ModelConfig, params: dict) -> tuple[dict, int]:
    """Step 3: ours written back in the release's format; (compare_states' figures, the release's
    parameter count, padded rows included)."""
    save_nanochat(cfg, params, folder / "export")

    def read(path):
        return {k: torch_to_numpy(v) for k, v in torch_state(path, mmap=True).items()}

    theirs = read(folder / "release" / "model" / "model_000000.pt")
    state = compare_states(cfg.vocab_size, theirs, read(folder / "export" / "model_000000.pt"))
    return state, sum(value.size for value in theirs.values())
