"""Run the command-line front doors in this process: a second process would pay the JAX (and torch)
imports and the compilations again."""

import runpy
import sys
from pathlib import Path

import pytest
from absl.testing import flagsaver


def run_tool(tool: Path, *argv) -> int:
    """A tools/ script with these arguments; its exit status."""
    old_argv, sys.argv = sys.argv, [str(tool), *map(str, argv)]
    try:
        runpy.run_path(str(tool), run_name="__main__")
    except SystemExit as exit_:
        return exit_.code
    finally:
        sys.argv = old_argv
    return 0


def run_main(*args: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """main.py with `args`; its absl flags are restored after."""
    import main as framework

    argv = ["main.py", *args]
    monkeypatch.setattr(sys, "argv", argv)  # config_flags reads the --config.<field> overrides from sys.argv
    with flagsaver.flagsaver():
        framework._parse_flags(argv)
        framework.main(argv[:1])
