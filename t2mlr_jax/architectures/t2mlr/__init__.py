"""T²MLR, and the plain transformer it must equal at γ = 0.

  settings.py      RecurrenceConfig: config.model.recurrence (the window, the mixer, the cache, D and B)
  mixers/          the gate zoo: every mixer Phi(x, R) by name
  fusion.py        R into the stream entering block l_start: the mixer, the recurrent projection, the cache
  recurrence.py    the passes: Jacobi (parallel over tokens), exact (token by token), one decode step
  decode.py        the cached decoder and `generate`
  flops.py         the expected training FLOPs of both forwards
  architecture.py  T2MLRSettings (config.t2mlr) and the architectures `t2mlr` and `transformer`, registered
                   when the systems are found (t2mlr_jax.architectures.import_systems)
  pretrained.py    retrofit: a pretrained plain transformer plus fresh fusion parameters at γ = 0
  release_configs.py  the authors' release config.json (T2MLRConfig) <-> our ModelConfig (pure Python)
  t2mlr_torch.py   the authors' checkpoint layout, the checkpoint format "t2mlr-torch" (registered with the
                   architectures: architecture.py imports it)
  torch_reference.py  the PyTorch reference of the exact recurrence, run by --verify (no JAX)

Other systems (recirculation runs T²MLR's passes over a single stack; the baselines the same plain
backbone) and interop use only what this file exports. Importing it imports no JAX: the settings and the
mixers' registry are pure Python, for the PyTorch reference; the rest loads on first use."""

import importlib

from t2mlr_jax.architectures.t2mlr.mixers import MIXERS, SHARED_KEYS, Mixer, linear_keys
from t2mlr_jax.architectures.t2mlr.settings import CACHE_NORMS, MixerOptions, RecurrenceConfig, recurrent

_LAZY = {
    "architecture": ("Depth", "T2MLRSettings", "backbone_architecture", "baseline_backbone", "stateless"),
    "decode": ("T2MLRDecoder", "generate"),
    "flops": ("exact_forward_flops", "exact_train_flops", "fusion_flops", "jacobi_train_flops"),
    "fusion": ("gamma_stats", "mixer_specs"),
    "recurrence": ("decode_step", "exact_forward", "forward", "jacobi_forward"),
    "release_configs": (
        "model_config_from_release",
        "recurrence_from_release",
        "release_config",
        "release_from_recurrence",
    ),
    "pretrained": ("check_retrofittable", "retrofit"),
    "t2mlr_torch": ("load_t2mlr_torch", "mixer_rules", "save_t2mlr_torch", "t2mlr_layout"),
    "torch_reference": ("T2MLRReference",),
}
_MODULE_OF = {name: module for module, names in _LAZY.items() for name in names}

__all__ = [  # the eager names above, then the lazy ones
    "CACHE_NORMS",
    "MIXERS",
    "Mixer",
    "MixerOptions",
    "RecurrenceConfig",
    "SHARED_KEYS",
    "linear_keys",
    "recurrent",
    *_MODULE_OF,
]


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = globals()[name] = getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)  # once
    return value
