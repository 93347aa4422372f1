"""Every trainable architecture, registered by name from its own module (see contract.py).

A new variant is one module here (or anywhere imported before the config is built) that calls
`register_architecture(name, build, settings=..., capabilities=...)`; nothing else changes.
"""

from __future__ import annotations

from t2mlr_jax.architectures import (  # noqa: F401  (registers the built-ins)
    looped,
    lrt,
    lstm,
    pause,
    ponderlm2,
    recirculation,
    t2mlr,
)
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
    "Architecture",
    "Capabilities",
    "arch_names",
    "build_architecture",
    "register_architecture",
]


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
