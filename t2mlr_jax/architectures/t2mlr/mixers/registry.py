"""The mixer registry's entry type and what every mixer shares in the release's state dict.

Pure Python (no JAX): the config checks, the release-config conversion and the PyTorch reference read a
mixer's name, key names and flags without importing JAX; its JAX functions are imported on first call.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from t2mlr_jax.registry import Registry

if TYPE_CHECKING:
    from t2mlr_jax.model.config import ModelConfig

Path = tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Mixer:
    """One Phi(x, R), named in `RecurrenceConfig.mixer`.

    specs: its own parameters as a ParamSpec tree (the shared W_rec and norms are added by the fusion).
    mix: (cfg, p, x, r) -> (Phi(x, r) at every position, per-token stats {name: [B, T]}); r is W_rec R
        when the mixer uses W_rec and the config enables it, R otherwise; p holds the shared parameters too.
    keys: each of its parameter paths -> the release's state-dict key under
        `model.layers.{l_start}.t2mlr_mixing_module.`.
    recurrent_projection: r = W_rec R first, when `RecurrenceConfig.recurrent_projection` is on.
    rezero: ReZero gammas (fp32, 0 at init, named `rezero_gamma*`) scale the mixed-in term: Phi = x at
        init.
    positional: `mix` also takes the tokens' positions [B, T] (keyword `positions`; recirculation's ramp).
    options: it reads its own settings from `RecurrenceConfig.mixer_options` (a parameter-free mix built by
        its architecture, e.g. recirculation's `Recirculation`); a mixer without them refuses any.
    """

    specs: Callable[[ModelConfig], dict]
    mix: Callable[..., tuple]
    keys: Mapping[Path, str]
    recurrent_projection: bool = False
    rezero: bool = False
    positional: bool = False
    options: bool = False


MIXERS: Registry = Registry("mixer")

# The parameters every mixer may have, by config: W_rec (recurrent_projection, for mixers that use it) and
# the streams' pre-norm scales (pre_norm). The learnable cache RMSNorm has no release counterpart.
SHARED_KEYS: dict[Path, str] = {
    ("recurrent_projection",): "recurrent_projection.weight",
    ("norm_x",): "norm_x.weight",
    ("norm_r",): "norm_r.weight",
}


def linear_keys(name: str) -> dict[Path, str]:
    """The keys of a torch nn.Linear with a bias, stored by us as {kernel, bias}."""
    return {(name, "kernel"): f"{name}.weight", (name, "bias"): f"{name}.bias"}


def deferred(module: str, name: str) -> Callable:
    """The function `name` of `module`, imported when first called."""

    def call(*args, **kwargs):
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__qualname__ = f"{module}.{name}"
    return call
