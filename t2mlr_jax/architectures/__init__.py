"""Every trainable architecture, registered by name from its own research system's package (see
contract.py for what a system provides).

The systems are found, not listed: every subpackage here is imported (t2mlr/, lrt/, ponderlm2/,
recirculation/, baselines/) with its `architecture` module where it has one (a package whose own import
stays light, as T²MLR's for its PyTorch reference, registers there), and so is every module named in the
environment variable T2MLR_JAX_SYSTEMS (comma-separated; a system kept outside this package, e.g. a
test's). A new system is one package that calls `register_architecture(name, build, settings=...,
capabilities=...)`; nothing else changes. The registry and the functions over it load, with every system,
on first use: importing this package imports no JAX.
"""

from __future__ import annotations

import importlib
import os
import pkgutil

SYSTEMS_VARIABLE = "T2MLR_JAX_SYSTEMS"
# What this package exports, from the contract, once every system is registered.
FROM_CONTRACT = (
    "ARCHITECTURES",
    "Architecture",
    "Capabilities",
    "arch_names",
    "build_architecture",
    "flops_per_step",
    "register_architecture",
)
__all__ = sorted([*FROM_CONTRACT, "SYSTEMS_VARIABLE", "import_systems"])


def import_systems() -> None:
    """Every system package here and every module T2MLR_JAX_SYSTEMS names (imported once: Python caches)."""
    packages = [f"{__name__}.{m.name}" for m in pkgutil.iter_modules(__path__) if m.ispkg]
    extra = [m.strip() for m in os.environ.get(SYSTEMS_VARIABLE, "").split(",") if m.strip()]
    for name in packages + extra:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if name not in extra or e.name != name:
                raise
            raise ValueError(f"{SYSTEMS_VARIABLE}: no module {name!r} to import a system from") from e
        if name in packages and any(m.name == "architecture" for m in pkgutil.iter_modules(module.__path__)):
            importlib.import_module(f"{name}.architecture")


def __getattr__(name: str):
    if name not in FROM_CONTRACT:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import_systems()
    value = globals()[name] = getattr(importlib.import_module(f"{__name__}.contract"), name)  # once
    return value
