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


def write_export_logits(out: Path, src: str, folder: Path, logits) -> None:
    """A driver's --logits_of output: <out>/export_logits.npz, the release's `logits` of the checkpoint
    `folder` and the checkout's commit."""
    import numpy as np

    out.mkdir(parents=True, exist_ok=True)
    np.savez(out / "export_logits.npz", logits=logits, release_commit=np.array(release_commit(src)))
    print(f"wrote {out}/export_logits.npz: the release's logits {logits.shape} of {folder}")


def parse_driver_args(parser, argv, check, fixture: Path, fixture_size: str | None):
    """The options every release driver shares (tools/release_parity.py's contract): --out (default the
    committed fixture, when `--size` is `fixture_size`), --logits_of DIR with --tokens_from NPZ; parsed,
    with the checkout checked by `check(src, python)` (ValueError -> one usage error)."""
    parser.add_argument(
        "--out",
        help=f"the folder to write (default, the fixture's size only: {fixture.name}'s fixture folder)",
    )
    parser.add_argument(
        "--logits_of",
        metavar="DIR",
        help="instead: the release's logits of the checkpoint folder DIR, into <out>/export_logits.npz",
    )
    parser.add_argument("--tokens_from", metavar="NPZ", help="with --logits_of: a .npz whose `tokens` to run")
    args = parser.parse_args(argv)
    try:
        check(args.release_src, args.release_python)
    except ValueError as e:
        parser.error(str(e))
    if (args.logits_of is None) != (args.tokens_from is None):
        parser.error("--logits_of and --tokens_from go together")
    if args.out is None and (args.size != fixture_size or args.logits_of):
        parser.error("--out is required with a --size other than the fixture's and with --logits_of")
    args.out = args.out or str(fixture)
    return args
