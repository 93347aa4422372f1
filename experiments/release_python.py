"""Running a release-side driver under the release's own Python (stdlib only: it runs there too)."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def run_under(python: str, module: str, argv: list[str]) -> None:
    """Replace this process with `python -m module argv`, unless this already is that interpreter."""
    if Path(sys.executable).absolute() != Path(python).absolute():
        os.execv(python, [python, "-m", module, *argv])
