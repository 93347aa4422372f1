"""Number-for-number parity of an imported PonderLM-2 release model (LUMIA-Group/PonderLM-2) with the
release's own outputs, through our arch "ponderlm2" with the release's settings (interop's
ponderlm2_release.py, ponderlm2_forward.py); shared by tests/interop/test_ponderlm2_release.py and
tools/release_parity.py (--release ponderlm2).

The release's side is the release.npz experiments/make_ponderlm2_fixture.py writes: tokens, jacobi (the R
its training forward drew), logits (that forward), loss, grad:<key> (by safetensors key), eval_logits (its
evaluation forward) and decode (its cached generation after a prefill of `prefill` tokens: the logits of
positions prefill - 1 onwards). Ours: the architecture's training apply at that draw (K, R + 1), its loss
and every gradient (mapped to the release's keys), its evaluation apply (the release's parallel
evaluation) and, for the decode, its exact recurrence, which is our cached decode (a scan of its decode
step over the KV cache) and ponderlm2's default evaluation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from t2mlr_jax.architectures import Architecture
from t2mlr_jax.architectures.baselines import PAUSE_PARAM
from t2mlr_jax.architectures.baselines.looped import LoopedDecoder
from t2mlr_jax.architectures.lrt import Draw
from t2mlr_jax.architectures.ponderlm2.evaluation import batch_of, evaluation_logits, ponderlm2
from t2mlr_jax.architectures.ponderlm2.release import (
    FIELDS,
    PAUSE_ID,
    load_ponderlm2_release,
    save_ponderlm2_release,
)
from t2mlr_jax.formats.files import read_json, read_state_dict
from t2mlr_jax.formats.tables import hf_layout, to_state_dict
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.generate import teacher_forced
from t2mlr_jax.studies.parity import (
    GRAD,
    compare_states,
    logits_figures,
    loss_and_gradient_figures,
    max_abs_diff,
)


def _trained(
    cfg: ModelConfig, params: dict, arch: Architecture, batch: dict, sample=None, pause_id: int | None = None
) -> dict:
    """The training apply's logits, its loss and every gradient (by the release's keys; the pause
    baseline's pause embedding is its embedding row `pause_id`, no text token's)."""
    state = arch.init_model_state()

    def loss(params):
        out = arch.apply(params, batch, training=True, rng=None, model_state=state, sample=sample)
        total, count = arch.loss(out, batch)["loss"]
        return total / count, out.logits

    (value, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    if pause_id is not None:
        pause = grads.pop(PAUSE_PARAM)
        grads["embed_tokens"] = grads["embed_tokens"].at[pause_id].add(pause)
    out = {"logits": np.asarray(logits), "loss": np.asarray(value)}
    return out | {GRAD + key: v for key, v in to_state_dict(hf_layout(cfg), grads).items()}


def our_outputs(cfg: ModelConfig, params: dict, settings: dict, tokens, jacobi: int, prefill: int) -> dict:
    """Ours in release.npz's layout (module docstring)."""
    tokens = jnp.asarray(tokens)
    t, k = tokens.shape[1], settings["thoughts"][0]
    arch = ponderlm2(cfg, settings, t * (k + 1))
    out = _trained(cfg, params, arch, batch_of(tokens, t * (k + 1)), Draw(k, jacobi + 1))
    out["eval_logits"] = evaluation_logits(cfg, params, settings, tokens)
    out["decode"] = evaluation_logits(cfg, params, {**settings, "eval_passes": 0}, tokens)[:, prefill - 1 :]
    return out


def loop_outputs(cfg: ModelConfig, params: dict, settings: dict, tokens, prefill: int) -> dict:
    """The loop baseline's (arch looped, section `settings`) in release.npz's layout: its training and
    evaluation applies are the one forward; the decode is our LoopedDecoder's, through the KV cache."""
    tokens = jnp.asarray(tokens)
    t = tokens.shape[1]
    arch = ponderlm2(cfg, settings, t, arch="looped")
    batch = batch_of(tokens, t)
    out = _trained(cfg, params, arch, batch)
    state = arch.init_model_state()
    out["eval_logits"] = np.asarray(
        jax.jit(lambda p: arch.apply(p, batch, training=False, rng=None, model_state=state).logits)(params)
    )
    scale = math.sqrt(2.5 * cfg.hidden_size)  # looped.embed_scale's
    loop = {name: settings[name] for name in ("start", "end", "repeats")}
    decoder = LoopedDecoder(cfg, **loop, embed_scale=scale)
    out["decode"] = np.asarray(teacher_forced(decoder, (params, None), tokens, prefill))[:, prefill - 1 :]
    return out


def pause_outputs(
    cfg: ModelConfig, params: dict, settings: dict, tokens, prefill: int, pause_id: int
) -> dict:
    """The pause baseline's (arch pause, section `settings`) in release.npz's layout: one forward for
    training and evaluation; its decode recomputes the prefix (as ours does), so it is that forward's."""
    tokens = jnp.asarray(tokens)
    t = tokens.shape[1]
    arch = ponderlm2(cfg, settings, t, arch="pause")
    batch = batch_of(tokens, t)
    out = _trained(cfg, params, arch, batch, pause_id=pause_id)
    state = arch.init_model_state()
    out["eval_logits"] = np.asarray(
        jax.jit(lambda p: arch.apply(p, batch, training=False, rng=None, model_state=state).logits)(params)
    )
    out["decode"] = out["eval_logits"][:, prefill - 1 :]
    return out


def path_layers(cfg: ModelConfig, settings: dict, method: str, jacobi: int = 0) -> dict:
    """The layers on the longest path to each output (parity.path_layers' for these models):
    - PonderLM-2 at K thoughts: its training forward runs K growing passes (a vocabulary-only pass, then
      over 1, ..., K - 1 thoughts) and its R + 1 = `jacobi` + 1 Jacobi passes, each through the stack on
      the last's states: (K + R + 1) L; its evaluation K growing passes and eval_passes: (K + eval_passes) L;
      its decode (our exact recurrence) chains a token's K + 1 slots, each fed the last one's state (tokens
      meet by attention only): (K + 1) L;
    - the loop baseline: the stack `repeats` times, for each output;
    - the pause baseline: L (its pause slots are inputs, met by attention)."""
    layers = cfg.num_layers
    if method == "loop":
        deep = settings["repeats"] * layers
        return {"logits": deep, "eval": deep, "decode": deep, "train": deep}
    if method == "pause":
        return {"logits": layers, "eval": layers, "decode": layers, "train": layers}
    k = settings["thoughts"][0]
    train = (k + jacobi + 1) * layers
    return {
        "logits": train,
        "eval": (k + settings["eval_passes"]) * layers,
        "decode": (k + 1) * layers,
        "train": train,
    }


def compare(
    ours: Mapping[str, np.ndarray], theirs: Mapping[str, np.ndarray], layers: Mapping[str, int]
) -> dict:
    """The figures of ours against the release's and whether each is within its derived bound (`layers`
    from `path_layers`; logits, eval and decode relative to the largest |logit| of the training forward)."""
    scale = float(np.abs(theirs["logits"]).max())
    logits = logits_figures(ours["logits"], theirs["logits"], layers["logits"], scale)
    figures = {
        "logits": logits,
        "eval": logits_figures(ours["eval_logits"], theirs["eval_logits"], layers["eval"], scale),
        "decode": {
            **logits_figures(ours["decode"], theirs["decode"], layers["decode"], scale),
            # the release against itself: its cached decode (sequential) vs its parallel evaluation
            "release_decode_vs_forward": max_abs_diff(
                theirs["decode"], theirs["eval_logits"][:, -theirs["decode"].shape[1] :]
            ),
        },
        **loss_and_gradient_figures(ours, theirs, layers["train"], logits["tolerance"] * scale),
    }
    figures["passed"] = all(
        figures[name]["passed"] for name in ("logits", "eval", "decode", "loss", "gradients")
    )
    return figures


# tools/release_parity.py's hooks (its Release.interop): steps 2 and 3 on a size's folder.


def release_config(folder: Path) -> dict:
    return read_json(folder / "release" / "model" / "config.json")


def our_side(folder: Path, prefill: int) -> tuple:
    """The release's folder imported through ours as the method its release.npz names (the folder does
    not record it); (cfg, (params, settings, method), compare's figures)."""
    with np.load(folder / "release" / "release.npz") as theirs:
        method = str(theirs["method"])
        cfg, params, settings = load_ponderlm2_release(folder / "release" / "model", method=method)
        layers = path_layers(cfg, settings, method, int(theirs["jacobi"]))
        if method == "loop":
            ours = loop_outputs(cfg, params, settings, theirs["tokens"], prefill)
        elif method == "pause":
            pause_id = release_config(folder).get("pause_token_id", PAUSE_ID)
            ours = pause_outputs(cfg, params, settings, theirs["tokens"], prefill, pause_id)
        else:
            ours = our_outputs(cfg, params, settings, theirs["tokens"], int(theirs["jacobi"]), prefill)
        figures = compare(ours, theirs, layers)
    return cfg, (params, settings, method), figures


def export_side(folder: Path, cfg: ModelConfig, imported) -> tuple[dict, int]:
    """Ours written back in the release's format; (its state dict against the release's, bitwise; the
    release's parameter count)."""
    params, settings, method = imported
    pause_id = release_config(folder).get("pause_token_id", PAUSE_ID)
    save_ponderlm2_release(cfg, params, settings, folder / "export", method=method, pause_token_id=pause_id)
    theirs = read_state_dict(folder / "release" / "model")
    state = compare_states(cfg.vocab_size, theirs, read_state_dict(folder / "export"))
    export, release = read_json(folder / "export" / "config.json"), release_config(folder)
    state["fields_differing"] = [f for f in FIELDS if export.get(f) != release.get(f)]
    state["bitwise"] = state["bitwise"] and not state["fields_differing"]
    return state, sum(v.size for v in theirs.values())
