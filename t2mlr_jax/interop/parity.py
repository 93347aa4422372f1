"""Number-for-number parity of an imported nanochat model (karpathy/nanochat, the LRT release) with the
release's own outputs, shared by tests/interop/test_nanochat_release.py and tools/release_parity.py.

The release's side is a dict in the layout experiments/make_nanochat_fixture.py writes to release.npz:
  logits       its forward on `tokens` [B, T, V]
  loss         mean next-token cross-entropy of a forward on tokens[:, :-1] against tokens[:, 1:]
  grad:<key>   that loss's gradient for every tensor of its state dict, by key
  decode       its KV-cached decode: a prefill, then one token per call (teacher forced) [B, T, V]
The release's recurrent (interleaved) GPT: `logits` are its sequential inference (also its decode), and
its training step (forward_interleaved_train on tokens[:, :-1] against tokens[:, 1:]) gives
  train_logits:<p>  pass p's logits: p = 0 the full pass [B, T-1, V], p = i + 1 interleaved pass i
                    (positions t % N == i)
  loss, grad:<key>  its loss (the mean of the passes' mean cross-entropies) and gradients
  refresh_logits:<p>, refresh_loss  the same step with its KV refresh (interleaved_kv_refresh=True)
`our_outputs` computes ours in the same layout (the gradients mapped to the release's keys, and padded,
by `to_nanochat_state`); `compare` gives the figures and the pass / fail of each against TOLERANCES;
`compare_states` checks an export's state dict against the release's, bitwise.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, Float, Int

from t2mlr_jax.architectures.contract import Outputs
from t2mlr_jax.architectures.lrt import interleaved_loss
from t2mlr_jax.architectures.lrt_forward import LRTConfig, LRTDecoder, interleaved
from t2mlr_jax.architectures.lrt_forward import exact_forward as lrt_exact
from t2mlr_jax.interop.nanochat import padded_vocab, to_nanochat_state
from t2mlr_jax.model import backbone
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.generate import T2MLRDecoder, teacher_forced
from t2mlr_jax.model.recurrence import make_layout

GRAD = "grad:"  # the prefix of a gradient's key
TRAIN_LOGITS = "train_logits:"  # the prefix of a training pass's logits (the recurrent GPT's)
REFRESH = "refresh_"  # the prefix of its training step's outputs with the KV refresh
# Logits are compared relative to the largest |logit|, as tools/convert_checkpoint.py --verify does: fp32
# summation order alone moves a 12-layer, 768-wide model's logits by ~1e-5 (the release's own cached
# decode and forward differ by 1.4e-5 there, and a float64 run of it is 1.2e-5 from either side).
TOLERANCES = {
    "logits": 1e-5,  # max |Δ logits| / max |logit|
    "training_logits": 1e-5,  # max over a training step's passes of max |Δ logits| / max |logit|
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


def interleaved_step(
    cfg: LRTConfig, params: dict, tokens: Int[Array, "B T"], passes: int, kv_refresh: bool
) -> tuple[Float[Array, ""], tuple]:
    """Our LRT's lrt.training="interleaved" step as the release takes one (tokens[:, :-1] against
    tokens[:, 1:], N = `passes`, the KV refresh or not): (loss, each pass's logits)."""
    inputs = tokens[:, :-1]
    layout = make_layout(inputs)
    batch = {
        "tokens": inputs,
        "targets": tokens[:, 1:],
        "loss_mask": jnp.ones_like(inputs),
        **layout._asdict(),
    }
    first, merged = interleaved(cfg, params, inputs, layout, passes, kv_refresh=kv_refresh).logits
    total, count = interleaved_loss(passes)(Outputs(merged, pass_logits=(first,)), batch)["loss"]
    return total / count, (first, *(merged[:, i::passes] for i in range(passes)))


# ((loss, each pass's logits), the loss's gradient), and the same without the gradient
interleaved_training = jax.jit(
    jax.value_and_grad(interleaved_step, argnums=1, has_aux=True), static_argnums=(0, 3, 4)
)
interleaved_forward = jax.jit(interleaved_step, static_argnums=(0, 3, 4))


def our_outputs(
    cfg: ModelConfig, params: dict, tokens, prefill: int, interleaved_passes: int | None = None
) -> dict[str, np.ndarray]:
    """Our logits, loss, gradients (by the release's keys) and cached decode on `tokens`, in the layout
    of the release's (module docstring). The interleaved GPT (params with "lrt": our LRT): its exact
    recurrence's logits and its cached decode, which the release's sequential inference is, and with
    `interleaved_passes` (the release's interleaved_num_passes) its training step's."""
    tokens = jnp.asarray(tokens)
    loss = grads = None
    if "lrt" in params:
        lrt = LRTConfig(cfg)
        out = {"logits": np.asarray(lrt_exact(lrt, params, tokens, make_layout(tokens)).logits)}
        decoder = LRTDecoder(lrt), (params, {})
        if interleaved_passes is not None:
            (loss, logits), grads = interleaved_training(lrt, params, tokens, interleaved_passes, False)
            out |= {f"{TRAIN_LOGITS}{p}": np.asarray(pass_logits) for p, pass_logits in enumerate(logits)}
            refresh_loss, logits = interleaved_forward(lrt, params, tokens, interleaved_passes, True)
            out |= {f"{REFRESH}logits:{p}": np.asarray(pass_logits) for p, pass_logits in enumerate(logits)}
            out[REFRESH + "loss"] = np.asarray(refresh_loss)
    else:
        out = {"logits": np.asarray(backbone.forward(cfg, params, tokens))}
        decoder = T2MLRDecoder(cfg), params
        loss, grads = loss_and_grads(cfg, params, tokens)
    if grads is not None:
        out["loss"] = np.asarray(loss)
        out |= {GRAD + key: value for key, value in to_nanochat_state(cfg, grads).items()}
        del grads
    out["decode"] = np.asarray(teacher_forced(*decoder, tokens, prefill))
    return out


def max_abs_diff(a, b) -> float:
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())


def compare(ours: Mapping[str, np.ndarray], theirs: Mapping[str, np.ndarray]) -> dict:
    """The figures of ours against the release's (both in the module docstring's layout; `theirs` may be
    an open np.load, read a key at a time) and whether each is within TOLERANCES. A recurrent release
    model's sequential logits are also its decode; its training step, where given, adds the figures of
    the passes' logits, the loss and the gradients."""
    logits = max_abs_diff(ours["logits"], theirs["logits"])
    scale = float(np.abs(theirs["logits"]).max())
    their_decode = theirs["decode"] if "decode" in theirs else theirs["logits"]
    decode = max_abs_diff(ours["decode"], their_decode)
    optional = {
        "loss": "loss" in theirs,
        "gradients": "loss" in theirs,
        "training_logits": TRAIN_LOGITS + "0" in theirs,
        "kv_refresh": REFRESH + "loss" in theirs,
    }
    checked = ("logits", "decode", *(name for name, present in optional.items() if present))
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
        figures |= _loss_and_gradients(ours, theirs)
    if optional["training_logits"]:
        figures["training_logits"] = _pass_logits(ours, theirs, TRAIN_LOGITS)
    if optional["kv_refresh"]:
        figures["kv_refresh"] = _kv_refresh(ours, theirs)
    figures["passed"] = all(figures[name]["passed"] for name in checked)
    return figures


def _pass_logits(ours: Mapping[str, np.ndarray], theirs: Mapping[str, np.ndarray], prefix: str) -> dict:
    """compare's figure of a training step's passes (keys prefix<pass>): the worst pass's max |Δ logits|
    / max |logit|."""
    keys = sorted((k for k in theirs if k.startswith(prefix)), key=lambda k: int(k.rsplit(":", 1)[1]))
    relative = [
        max_abs_diff(ours[key], theirs[key]) / float(np.abs(theirs[key]).max()) if key in ours else np.inf
        for key in keys
    ]
    return {
        "passes": len(keys),
        "relative": relative,  # per pass: 0 the full one, then the interleaved ones
        "max_relative": max(relative),
        "tolerance": TOLERANCES["training_logits"],
        "passed": max(relative) <= TOLERANCES["training_logits"],
    }


def _kv_refresh(ours: Mapping[str, np.ndarray], theirs: Mapping[str, np.ndarray]) -> dict:
    """compare's figure of the training step with the KV refresh: its passes' logits and its loss."""
    figures = _pass_logits(ours, theirs, REFRESH + "logits:")
    key = REFRESH + "loss"
    loss = abs(float(ours[key]) - float(theirs[key])) if key in ours else np.inf
    figures |= {"loss_abs_diff": loss, "loss_tolerance": TOLERANCES["loss"]}
    figures["passed"] = figures["passed"] and loss <= TOLERANCES["loss"]
    return figures


def _loss_and_gradients(ours: Mapping[str, np.ndarray], theirs: Mapping[str, np.ndarray]) -> dict:
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
