"""Running a release-side driver under the release's own Python, and the commit of the checkout it runs
(stdlib only: it runs there too)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_under(python: str, module: str, argv: list[str]) -> None:
    """Replace this process with `python -m module argv`, unless this already is that interpreter."""
    if Path(sys.executable).absolute() != Path(python).absolute():
        os.execv(python, [python, "-m", module, *argv])


def release_commit(src: str) -> str:
    """The checkout's HEAD, recorded with what a driver writes."""
    return subprocess.run(
        ["git", "-C", src, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
