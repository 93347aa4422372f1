"""What the trainer trains: one `Architecture` per config `arch`, all with the same pure-function interface.

  t2mlr          the backbone with the recurrence (Jacobi or exact training, exact evaluation by default)
  transformer    the same backbone without it (widened to T²MLR's parameter count if baseline.param_match)
  looped         blocks [loop_start, loop_end] run loop_repeats times (full x2 by default)
  middle_looped  the same module, presets choose the paper's middle range (layers 9-22, x3)
  pause          baseline.pause_tokens learned pause tokens after every token
  lstm           the release's S5 RNN baseline

With `config.init_from` every backbone architecture starts from that checkpoint instead of random weights
(`Architecture.pretrained`): T²MLR retrofits a plain transformer (fresh fusion parameters, γ = 0: exactly the
pretrained model at step 0) or continues a T²MLR checkpoint of the same recurrence; the others take its
weights as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jaxtyping import Array, Float

from t2mlr_jax.baselines.decode import greedy_by_recompute
from t2mlr_jax.baselines.looped import loop_range, looped_forward, unrolled
from t2mlr_jax.baselines.lstm import init_lstm, lstm_forward
from t2mlr_jax.baselines.pause import PAUSE_PARAM, init_pause, pause_forward
from t2mlr_jax.config_utils import ARCHS, model_config
from t2mlr_jax.interop.pretrained import check_retrofittable, load_pretrained, mismatches, pretrained_config
from t2mlr_jax.model import generate as generation
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.fusion import gamma_stats
from t2mlr_jax.model.params import init_params
from t2mlr_jax.model.recurrence import forward
from t2mlr_jax.model.spec import count_params

FORWARD_MODES = ("jacobi", "exact")


class Architecture(NamedTuple):
    name: str
    model: ModelConfig | None  # the backbone's config; None for the LSTM
    init: Callable[[jax.Array], dict]
    # (params, tokens, layout, training, d_forward=None) -> (logits [B,T,V] fp32, per-token gate stats
    # {name: [B,T]}); d_forward overrides the Jacobi depth D (architectures without the recurrence ignore it)
    apply: Callable[..., tuple[Float[Array, "B T V"], dict]]
    # (params, prompt_tokens, prompt_mask, prompt_control_flow, max_new_tokens, eos_id, pad_id) -> GenerateOutput
    generate: Callable[..., generation.GenerateOutput]
    gamma_stats: Callable[[dict], dict]  # scalars to log (tanh of the ReZero gammas)
    # () -> host weights (config.init_from) replacing init's top-level entries of the same name; what they
    # lack (a retrofitted T²MLR's mixer, the pause embeddings) starts fresh. Called only for a fresh start:
    # a resumed or evaluated run never reads the pretrained file.
    pretrained: Callable[[], dict] | None = None

    def num_params(self) -> int:
        return count_params(jax.eval_shape(self.init, jax.random.PRNGKey(0)))


def _no_stats(params: dict) -> dict:
    return {}


def _t2mlr(config: ml_collections.ConfigDict, model: ModelConfig) -> Architecture:
    train, evaluation = config.train, config.eval
    for where, mode in (("train.forward_mode", train.forward_mode), ("eval.mode", evaluation.mode)):
        if mode not in FORWARD_MODES:
            raise ValueError(f"{where} must be one of {FORWARD_MODES}, got {mode!r}")

    def apply(params, tokens, layout, training, d_forward=None):
        # Without recurrence every mode is the same function; "jacobi" computes it in one parallel pass.
        mode = "jacobi" if model.recurrence is None else train.forward_mode if training else evaluation.mode
        bptt = (train.bptt or None) if training else None
        out = forward(model, params, tokens, mode=mode, layout=layout, bptt=bptt, d_forward=d_forward)
        return out.logits, out.gate_stats

    def generate(params, prompt, mask, control_flow, max_new_tokens, eos_id, pad_id):
        return generation.generate(
            model,
            params,
            prompt,
            mask,
            max_new_tokens=max_new_tokens,
            eos_id=eos_id,
            pad_id=pad_id,
            prefill=evaluation.prefill,
            prefill_passes=evaluation.prefill_passes,
            prompt_control_flow=control_flow,
        )

    stats = (lambda params: gamma_stats(model, params["mixer"])) if model.recurrence else _no_stats
    return Architecture(
        "t2mlr" if model.recurrence else "transformer",
        model,
        lambda key: init_params(model, key),
        apply,
        generate,
        stats,
    )


def _with_forward(name: str, model: ModelConfig | None, init, logits_fn) -> Architecture:
    """An architecture given only its causal forward: decoding re-runs it (pause tokens, LSTM)."""
    apply = lambda params, tokens, layout, training, d_forward=None: (logits_fn(params, tokens, layout), {})

    def generate(params, prompt, mask, control_flow, max_new_tokens, eos_id, pad_id):
        return greedy_by_recompute(
            logits_fn,
            params,
            prompt,
            mask,
            control_flow,
            max_new_tokens=max_new_tokens,
            eos_id=eos_id,
            pad_id=pad_id,
        )

    return Architecture(name, model, init, apply, generate, _no_stats)


def _backbone_baseline(name: str, config: ml_collections.ConfigDict, model: ModelConfig) -> Architecture:
    b = config.baseline
    if name == "transformer":
        return _t2mlr(config, model)
    if name in ("looped", "middle_looped"):
        loop = dict(start=b.loop_start, end=b.loop_end, repeats=b.loop_repeats)
        loop_range(model, b.loop_start, b.loop_end)  # reject a bad range before anything is traced

        def generate(params, prompt, mask, control_flow, max_new_tokens, eos_id, pad_id):
            # The same model written out as a plain transformer, so decoding has the backbone's KV cache.
            return generation.generate(
                *unrolled(model, params, **loop),
                prompt,
                mask,
                max_new_tokens=max_new_tokens,
                eos_id=eos_id,
                pad_id=pad_id,
                prompt_control_flow=control_flow,
            )

        return _with_forward(
            name,
            model,
            lambda key: init_params(model, key),
            lambda p, t, lay: looped_forward(model, p, t, lay, **loop),
        )._replace(generate=generate)

    def init(key):
        k_model, k_pause = jax.random.split(key)
        return {**init_params(model, k_model), PAUSE_PARAM: init_pause(model, k_pause)}

    return _with_forward(
        name, model, init, lambda p, t, lay: pause_forward(model, p, t, lay, num_pause=b.pause_tokens)
    )


def _matched_hidden(name: str, config: ml_collections.ConfigDict) -> int:
    """The narrowest width (in steps of baseline.width_multiple) with at least T²MLR's parameter count."""
    target = _random_init(config, "t2mlr").num_params()
    hidden = config.model.hidden_size
    while (
        _backbone_baseline(
            name, config, model_config(config, recurrent=False, hidden_size=hidden)
        ).num_params()
        < target
    ):
        hidden += config.baseline.width_multiple
    return hidden


def _from_checkpoint(arch: Architecture, path: str) -> Architecture:
    """`arch` with the checkpoint at `path` as its starting weights. Its config is checked here (before
    anything compiles, so a checkpoint of another model is one clear error); its weights are read when
    a fresh run starts."""
    if arch.model is None:
        raise ValueError(
            f"init_from: the {arch.name} baseline has no transformer backbone to load weights into"
        )
    if not Path(path).exists():
        raise FileNotFoundError(f"init_from {path!r} does not exist")
    model = arch.model
    checkpoint = pretrained_config(path, param_dtype=model.param_dtype)
    differences = mismatches(checkpoint, model)
    if differences:
        raise ValueError(
            f"init_from {path}: the checkpoint is not config.model ({len(differences)} differing "
            f"fields: {'; '.join(differences)})"
        )
    if model.recurrence is not None and checkpoint.recurrence is None:
        check_retrofittable(model.recurrence)  # the fresh mixer (gammas 0) keeps the pretrained function

    def weights() -> dict:
        _, loaded = load_pretrained(path, param_dtype=model.param_dtype)
        return jax.tree.map(lambda w: np.asarray(w, jnp.dtype(model.param_dtype)), loaded)

    return arch._replace(pretrained=weights)


def build_architecture(config: ml_collections.ConfigDict, name: str | None = None) -> Architecture:
    """The architecture `name` (default: config.arch, which must then be a single name), initialised from
    config.init_from when that is set."""
    name = name or config.arch
    if name not in ARCHS:
        raise ValueError(f"arch must be one of {ARCHS} (or a comma list of them), got {name!r}")
    if config.init_from is None:
        raise ValueError(
            "init_from is required by this config: pass --config.init_from=<checkpoint> "
            "(a .gguf file, an HF or T²MLR folder, or an orbax checkpoint)"
        )
    arch = _random_init(config, name)
    return _from_checkpoint(arch, config.init_from) if config.init_from else arch


def _random_init(config: ml_collections.ConfigDict, name: str) -> Architecture:
    """The architecture `name` with freshly drawn weights."""
    if name == "t2mlr":
        return _t2mlr(config, model_config(config))
    if name == "lstm":
        b, vocab = config.baseline, config.model.vocab_size
        return _with_forward(
            name,
            None,
            lambda key: init_lstm(key, vocab_size=vocab, hidden=b.lstm_hidden, layers=b.lstm_layers),
            lstm_forward,
        )
    if config.baseline.param_match and config.init_from:
        raise ValueError(
            f"baseline.param_match widens the {name} baseline, so it cannot load init_from's "
            f"weights; set --config.baseline.param_match=False to train the pretrained width"
        )
    hidden = _matched_hidden(name, config) if config.baseline.param_match else None
    return _backbone_baseline(name, config, model_config(config, recurrent=False, hidden_size=hidden))


def arch_names(config: ml_collections.ConfigDict) -> list[str]:
    names = [n.strip() for n in config.arch.split(",") if n.strip()]
    for n in names:
        if n not in ARCHS:
            raise ValueError(f"arch must be one of {ARCHS} (or a comma list of them), got {n!r}")
    if not names or len(set(names)) != len(names):
        raise ValueError(f"arch must name each architecture once, got {config.arch!r}")
    return names
