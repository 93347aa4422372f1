"""TPU pods, compiled for real from this CPU: tools/aot_compile.py run once per row of a study, each in its
own process, and the rows gathered into one table.

  python -m experiments.tpu_scaling --study=coverage   # every architecture, tiny, on v5e:2x2, v5e:16x16
                                                       # and v5p:4x4x4: train, eval, decode, Jacobi prefill
  python -m experiments.tpu_scaling --study=pods       # the README's table: SmolLM2-135M / 360M / 1B T²MLR
                                                       # and transformer at seq 2048, each recipe at its
                                                       # planned ZeRO stage and rows per chip and at 1, 4
                                                       # and 8 rows per chip, the LRT's paper sizes, on
                                                       # v5e-256, v5p-64 and v6e-64; the largest T²MLR
                                                       # that fits v5e-256
  python -m experiments.tpu_scaling --study=pods --rows=135M_v5e-256   # one row
  python -m experiments.tpu_scaling --study=calibration  # MaxText's measured runs at their shapes, the
                                                       # estimate beside each measurement

Each row's tool run writes <out>/<row>/aot.json, aot.md and the compiled HLO; a rerun skips rows whose
aot.json exists (--force recompiles). Written to --out (default runs/tpu_<study>): scaling.json (every
row's setting and per-program reports), scaling.md (the table; also printed). Compiles of the paper
sizes take minutes each and several GB of memory: --jobs runs rows side by side (default 1).
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tqdm import tqdm

from t2mlr_jax.config.cli import OneLineParser
from t2mlr_jax.parallel.compiled_report import hlo_report
from t2mlr_jax.studies import ROOT
from t2mlr_jax.studies.tpu.rows import STUDIES, Row
from t2mlr_jax.studies.tpu.tables import calibration_table, per_chip_table, table, train_ratios, train_table

TOOL = ROOT / "tools" / "aot_compile.py"


def command(row: Row, out: Path) -> list[str]:
    return [
        sys.executable,
        str(TOOL),
        f"--config={row.config}",
        f"--arch={row.arch}",
        f"--topology={row.topology}",
        f"--mesh={row.mesh}",
        f"--batch={row.batch}",
        f"--seq_len={row.seq_len}",
        f"--programs={row.programs}",
        f"--out={out / row.name}",
        f"--config.mesh.zero={row.zero}",
        *row.overrides,
    ]


def run_row(row: Row, out: Path, force: bool) -> dict:
    """The row's aot.json (compiled now unless it exists), or its failure's last error line."""
    done = out / row.name / "aot.json"
    if force or not done.exists():
        ran = subprocess.run(command(row, out), cwd=ROOT, capture_output=True, text=True)
        (out / row.name).mkdir(parents=True, exist_ok=True)
        (out / row.name / "stderr.txt").write_text(ran.stderr)
        if not done.exists():
            errors = [line for line in ran.stderr.splitlines() if line.startswith("error:")]
            return {"row": row._asdict(), "error": errors[-1] if errors else ran.stderr[-500:]}
    return {"row": row._asdict(), **reported(json.loads(done.read_text()), out / row.name)}


def reported(result: dict, folder: Path) -> dict:
    """The row's programs reported again from their kept HLO by the current analysis (hlo_report): a
    change to the analysis needs no recompile."""
    for p in result["programs"]:
        if "roofline" not in p:
            continue
        if "device_coords" not in p:
            raise ValueError(f"{folder / 'aot.json'} predates the link and HBM counts: rerun with --force")
        with gzip.open(folder / "hlo" / f"{p['arch']}_{p['program']}.hlo.gz", "rt") as f:
            hlo = f.read()
        cost = {"flops": p["cost"]["xla_flops"], "bytes_accessed": p["cost"]["xla_bytes_accessed"]}
        p.update(
            hlo_report(
                hlo,
                p["memory"],
                cost,
                p["device_kind"],
                p["devices"],
                p["devices_per_chip"],
                p["roofline"]["model_flops"],
                p["device_coords"],
                p["memory"]["available_hbm_bytes"],
            )
        )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(description=__doc__)
    parser.add_argument("--study", choices=sorted(STUDIES), default="coverage")
    parser.add_argument("--rows", default="", help="comma list of row names (default: every row)")
    parser.add_argument("--out", type=Path, help="output folder (default runs/tpu_<study>)")
    parser.add_argument("--jobs", type=int, default=1, help="rows compiled side by side")
    parser.add_argument("--force", action="store_true", help="recompile rows whose aot.json exists")
    args = parser.parse_args(argv)
    rows = STUDIES[args.study]()
    if args.rows:
        wanted = {name.strip() for name in args.rows.split(",") if name.strip()}
        unknown = wanted - {row.name for row in rows}
        if unknown:
            print(
                f"error: --rows: {sorted(unknown)} not in study {args.study}: {[r.name for r in rows]}",
                file=sys.stderr,
            )
            return 2
        rows = [row for row in rows if row.name in wanted]
    if args.jobs < 1:
        print(f"error: --jobs must be >= 1, got {args.jobs}", file=sys.stderr)
        return 2
    out = args.out or ROOT / "runs" / f"tpu_{args.study}"
    out.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(
            tqdm(pool.map(lambda r: run_row(r, out, args.force), rows), total=len(rows), unit="row")
        )
    (out / "scaling.json").write_text(json.dumps(results, indent=2))
    tables = (calibration_table(results),) if args.study == "calibration" else ()
    tables += (per_chip_table(results), train_table(results), train_ratios(results), table(results))
    markdown = "\n".join(filter(None, tables))
    (out / "scaling.md").write_text(f"# TPU {args.study}\n\n" + markdown)
    print(markdown)
    print(f"-> {out / 'scaling.json'}, {out / 'scaling.md'}")
    failed = [r for r in results if "error" in r or any("error" in p for p in r.get("programs", []))]
    return 1 if failed else 0
