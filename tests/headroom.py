"""Tabulate the bounds' headroom (error / bound) that the numerics tests recorded under each instruction set
(tests/tolerance.py, `make test-isa`): one row per bound, one column per set, the worst ratio first, and
how far each moved between the sets.

    python -m tests.headroom runs/isa/native.jsonl runs/isa/AVX2.jsonl runs/isa/SSE4_2.jsonl

Writes <folder of the first file>/headroom.md and headroom.json and prints the table. A bound's checks that
are meant to fail (a planted bug, `what` starting with "planted") are listed apart: there the ratio must stay
above 1.
"""

import json
from pathlib import Path

from t2mlr_jax.config.cli import OneLineParser


def read(path: Path) -> dict[tuple[str, str], float]:
    """(test, what) -> the largest error / bound recorded in one run."""
    worst = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        key = (row["test"].split("@")[0], row["what"])  # without an xdist group's suffix
        worst[key] = max(worst.get(key, 0.0), row["error"] / row["bound"])
    return worst


def moves(runs: dict[str, dict]) -> dict[tuple[str, str], float]:
    """How far each bound's error / bound moved between the sets that recorded it (max - min)."""
    seen = {}
    for run in runs.values():
        for key, ratio in run.items():
            seen.setdefault(key, []).append(ratio)
    return {key: max(ratios) - min(ratios) for key, ratios in seen.items() if len(ratios) > 1}


def table(runs: dict[str, dict]) -> list[str]:
    names, moved = list(runs), moves(runs)
    keys = sorted(
        {key for run in runs.values() for key in run}, key=lambda k: -max(r.get(k, 0) for r in runs.values())
    )
    lines = ["| test | bound | " + " | ".join(names) + " | moved |", "|---|---|" + "---:|" * (len(names) + 1)]
    for test, what in keys:
        cells = [f"{runs[name][(test, what)]:.3f}" if (test, what) in runs[name] else "-" for name in names]
        cells.append(f"{moved[test, what]:.3f}" if (test, what) in moved else "-")
        lines.append(f"| `{test.removeprefix('tests/')}` | {what} | " + " | ".join(cells) + " |")
    return lines


def by_file(runs: dict[str, dict]) -> list[str]:
    """Each test file's bounds: how many, and the worst error / bound under each set."""
    names, files = list(runs), {}
    for name, run in runs.items():
        for (test, _), ratio in run.items():
            worst = files.setdefault(test.split("::")[0].removeprefix("tests/"), {})
            worst[name] = max(worst.get(name, 0.0), ratio)
    counts = {}
    for test, _ in {key for run in runs.values() for key in run}:
        file = test.split("::")[0].removeprefix("tests/")
        counts[file] = counts.get(file, 0) + 1
    lines = ["| file | bounds | " + " | ".join(names) + " |", "|---|---:|" + "---:|" * len(names)]
    for file in sorted(files, key=lambda f: -max(files[f].values())):
        cells = [f"{files[file][name]:.3f}" if name in files[file] else "-" for name in names]
        lines.append(f"| `{file}` | {counts[file]} | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    parser = OneLineParser(description=__doc__)
    parser.add_argument("runs", nargs="+", type=Path, help="one JSONL per instruction set, named after it")
    args = parser.parse_args()
    missing = [str(path) for path in args.runs if not path.is_file()]
    if missing:
        parser.error(f"no such file: {', '.join(missing)}")
    runs = {path.stem: read(path) for path in args.runs}
    planted = {
        name: {k: v for k, v in run.items() if k[1].startswith("planted")} for name, run in runs.items()
    }
    bounds = {name: {k: v for k, v in run.items() if k not in planted[name]} for name, run in runs.items()}
    worst = {name: max(run.values(), default=0.0) for name, run in bounds.items()}
    moved = {key: value for key, value in moves(bounds).items() if value > 0}
    largest = max(moved, key=moved.get, default=None)
    most = f"; the most, by {moved[largest]:.3f} of its bound: {largest[0]} ({largest[1]})" if largest else ""
    lines = [
        "Largest error / bound: " + ", ".join(f"{name} {value:.3f}" for name, value in worst.items()),
        f"Moved between the sets: {len(moved)} of {len(moves(bounds))} bounds{most}",
        "",
        "By file (the worst error / bound of its bounds):",
        "",
        *by_file(bounds),
        "",
        "Every bound:",
        "",
        *table(bounds),
        "",
        "Planted bugs (error / bound, must stay > 1):",
        "",
        *table(planted),
    ]
    folder = args.runs[0].parent
    (folder / "headroom.md").write_text("\n".join(lines) + "\n")
    summary = {
        "worst": worst,
        "moved": {f"{t}::{w}": v for (t, w), v in moved.items()},
        "bounds": {n: {f"{t}::{w}": v for (t, w), v in r.items()} for n, r in runs.items()},
    }
    (folder / "headroom.json").write_text(json.dumps(summary, indent=1))
    print("\n".join(lines))
    print(f"\nwritten: {folder / 'headroom.md'}, {folder / 'headroom.json'}")


if __name__ == "__main__":
    main()
