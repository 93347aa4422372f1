"""Every trainable architecture, registered by name from its own research system's package (see
contract.py for what a system provides).

The systems are found, not listed: every subpackage here is imported (t2mlr/, lrt/, ponderlm2/,
recirculation/, baselines/), and so is every module named in the environment variable T2MLR_JAX_SYSTEMS
(comma-separated; a system kept outside this package, e.g. a test's). A new system is one package that
calls `register_architecture(name, build, settings=..., capabilities=...)`; nothing else changes.
"""

from __future__ import annotations

import importlib
import os
import pkgutil

from t2mlr_jax.architectures.contract import (
    ARCHITECTURES,
    Architecture,
    Capabilities,
    register_architecture,
    with_layers_apart,
)
from t2mlr_jax.config.sections import Experiment

__all__ = [
    "ARCHITECTURES",
    "SYSTEMS_VARIABLE",
    "Architecture",
    "Capabilities",
    "arch_names",
    "build_architecture",
    "import_systems",
    "flops_per_step",
    "register_architecture",
]

SYSTEMS_VARIABLE = "T2MLR_JAX_SYSTEMS"


def import_systems() -> None:
    """Every system package here and every module T2MLR_JAX_SYSTEMS names (imported once: Python caches)."""
    packages = [f"{__name__}.{m.name}" for m in pkgutil.iter_modules(__path__) if m.ispkg]
    extra = [m.strip() for m in os.environ.get(SYSTEMS_VARIABLE, "").split(",") if m.strip()]
    for name in packages + extra:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if name not in extra or e.name != name:
                raise
            raise ValueError(f"{SYSTEMS_VARIABLE}: no module {name!r} to import a system from") from e


import_systems()


def arch_names(config: Experiment) -> list[str]:
    """config.arch as a list: one name, or a comma list to train each and compare them."""
    names = [n.strip() for n in config.arch.split(",") if n.strip()]
    for name in names:
        ARCHITECTURES.get(name)
    if not names or len(set(names)) != len(names):
        raise ValueError(f"arch must name each architecture once, got {config.arch!r}")
    return names


def build_architecture(config: Experiment, name: str | None = None) -> Architecture:
    """The architecture `name` (default: config.arch, a single name) with freshly drawn weights."""
    name = name or config.arch
    entry = ARCHITECTURES.get(name)
    if config.eval.thoughts not in (None, 0) and not entry.capabilities.thought_slots:
        thinkers = sorted(n for n, e in ARCHITECTURES.items() if e.capabilities.thought_slots)
        raise ValueError(
            f"eval.thoughts={config.eval.thoughts}: architecture {name!r} has no latent thought slots "
            f"(those with them: {', '.join(thinkers)})"
        )
    arch = entry.build(config)
    return arch if config.model.scan_layers else with_layers_apart(arch)


def flops_per_step(config: Experiment, arch: Architecture) -> float | None:
    """The expected training FLOPs of one optimizer step (None: the architecture has no accounting)."""
    if arch.train_flops is None:
        return None
    return config.train.batch_size * arch.train_flops(config.data.seq_len)
