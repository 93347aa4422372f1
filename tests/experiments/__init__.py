"""Tests of the experiment scripts, loaded as users run them (files in experiments/, not a package)."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_script(name: str):
    """experiments/<name>.py as a module (running it puts the repo root on sys.path, as from a checkout)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "experiments" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
