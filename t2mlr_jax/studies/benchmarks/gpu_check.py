"""The GPU check: one run of at most 10 minutes on one H100 / H200 that measures what a GPU is needed for,
written as JSON and markdown under --out (docs/gpu_check.md says how to read them).

Needs: a Python with jax on CUDA (e.g. pip install -U "jax[cuda12]") and this repository's requirements
(pip install -e . from the repo root; or run experiments/gpu_check.sh, which puts the root on PYTHONPATH).
Without a GPU backend it stops with one line, unless --dry-run.

Parts (in this order; env always runs first):
  env        device, versions, peak bf16 FLOP/s for MFU, the sizes of this run
  attention  einsum / xla / cudnn attention equal to the fp32 reference within tolerance; fwd and fwd+bwd ms
  train      bf16 135M train step of the transformer, T²MLR (13,18) and the LRT: ms, tokens/s, MFU
  decode     generate() tok/s of the baseline and T²MLR windows, T²MLR's overhead (paper Table 7)
  prefill    Jacobi prefill speed-up over exact prefill per window and D (paper Table 8)

Each part runs in a process of its own under its share of --budget_s (time a part leaves unused goes to
the next); it writes its rows as they finish and starts no unit it has no time left for, so a part that
crashes or runs out of time keeps what it measured, and the next part still runs. --dry-run runs every
part at tiny sizes on the CPU.

  experiments/gpu_check.sh --out=runs/gpu_check                      # on the GPU, <= 10 minutes
  python -m experiments.gpu_check --dry-run --out=/tmp/gpu_check     # CPU, tiny sizes, ~1-2 minutes

Writes <out>/gpu_check.json and <out>/gpu_check.md after every part, each part's log in <out>/logs/.
Exit status 0 when every part ran, 1 when one failed, ran out of time or did not run, 2 on bad arguments or
no GPU backend.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from t2mlr_jax.config.cli import OneLineParser, fail
from t2mlr_jax.studies import ROOT

COMMAND = "python -m experiments.gpu_check"
# Each part's share of --budget_s, in running order (GPU estimates: CUDA start-up ~10 s a process, then
# compiles of 10-60 s per program).
SHARES = {"env": 0.06, "attention": 0.1, "train": 0.34, "decode": 0.27, "prefill": 0.23}
MEASURED = tuple(p for p in SHARES if p != "env")
DEFAULT_BUDGET_S = {"gpu": 540.0, "dry": 300.0}  # the GPU's leaves a minute of the 10 for start-up
# XLA:CPU without LLVM optimisation and with its older fusion emitters: the dry run's ~15 compiles take
# about half the time (tests/xla_flags.py's FAST_COMPILE, for the same reason).
DRY_RUN_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
NO_GPU_HINT = (
    "install jax with CUDA (pip install -U 'jax[cuda12]') and this package (pip install -e .), or pass "
    "--dry-run for the CPU-sized run"
)
# Columns of each part's table: (header, row key); a row's error or skip reason goes in a last column.
COLUMNS = {
    "env": [
        ("device", "device_kind"),
        ("platform", "platform"),
        ("count", "device_count"),
        ("memory GiB", "memory_gib"),
        ("peak TFLOP/s", "peak_tflops"),
        ("auto attention", "auto_attention"),
        ("jax", "jax"),
    ],
    "attention": [
        ("impl", "case"),
        ("ran as", "ran_as"),
        ("fwd ms", "fwd_ms"),
        ("fwd+bwd ms", "fwd_bwd_ms"),
        ("max rel err", "worst_err"),
        ("within tol", "within_tolerance"),
    ],
    "train": [
        ("model", "case"),
        ("params", "params"),
        ("attention", "attention"),
        ("step ms", "step_ms"),
        ("tokens/s", "tokens_per_s"),
        ("TFLOP/s", "tflops_per_s"),
        ("MFU", "mfu"),
        ("compile s", "compile_s"),
    ],
    "decode": [
        ("case", "case"),
        ("baseline tok/s", "baseline_tokens_per_s"),
        ("T²MLR tok/s", "tokens_per_s"),
        ("T²MLR / baseline time", "ratio"),
        ("paper", "paper_ratio"),
    ],
    "prefill": [
        ("case", "case"),
        ("exact ms", "exact_ms"),
        ("Jacobi ms", "jacobi_ms"),
        ("speed-up", "speedup"),
        ("paper", "paper_speedup"),
        ("max abs Δlogit", "max_abs_logit_diff"),
    ],
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = OneLineParser(prog=COMMAND, description=__doc__)
    parser.add_argument("--out", default="runs/gpu_check", help="folder for gpu_check.json / .md and logs/")
    parser.add_argument(
        "--parts", default=",".join(MEASURED), help="comma-separated subset of " + ",".join(MEASURED)
    )
    parser.add_argument(
        "--budget_s",
        type=float,
        help=f"seconds for all parts together (default {DEFAULT_BUDGET_S['gpu']:.0f}, dry run "
        f"{DEFAULT_BUDGET_S['dry']:.0f}); the parts that run share it as "
        + ", ".join(f"{p} {100 * s:.0f}%%" for p, s in SHARES.items()),
    )
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU (no GPU needed)")
    parser.add_argument("--worker", choices=list(SHARES), help=argparse.SUPPRESS)  # one part, in-process
    parser.add_argument("--part_file", help=argparse.SUPPRESS)  # where the worker writes its part
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)  # the worker's end, time.time()
    args = parser.parse_args(argv)
    args.sizes = "dry" if args.dry_run else "gpu"
    if args.worker:
        return args
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(MEASURED))
    if unknown or not parts:
        fail(f"--parts: unknown {unknown or 'empty'}; choose from {','.join(MEASURED)}")
    args.parts = [p for p in MEASURED if p in parts]
    if args.budget_s is None:
        args.budget_s = DEFAULT_BUDGET_S[args.sizes]
    if args.budget_s <= 0:
        fail(f"--budget_s must be > 0, got {args.budget_s}")
    return args


def one_line(error: BaseException) -> str:
    return f"{type(error).__name__}: " + " ".join(str(error).split())


def write_json(path: Path, payload: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=1))
    tmp.replace(path)  # a reader (the parent after a kill) never sees half a file


def worker(part: str, sizes_name: str, path: Path, deadline: float) -> None:
    """Run one part in this process, rewriting `path` after every unit: {"status", "cases", "summary"?,
    "error"?}. A unit that would not end by `deadline` (time.time(); were it to take as long as the
    longest so far) is not started but skipped, so a part stops where it fits rather than being killed.
    Imported here: the parent never loads jax, whose GPU client would hold the memory the parts need."""
    import warnings

    from t2mlr_jax.studies.benchmarks import gpu_parts

    warnings.filterwarnings("ignore", message="Some donated buffers were not usable")  # a CPU cannot donate
    record: dict = {"status": "running", "cases": []}
    write_json(path, record)
    try:
        built = gpu_parts.PARTS[part](gpu_parts.SIZES[sizes_name])
        longest = 0.0
        for label, unit in built.units:
            start, left = time.time(), deadline - time.time()
            if left < longest:
                reason = f"not started: {left:.0f} s of the part's budget left, a unit took {longest:.0f} s"
                record["cases"].append({"case": label, "skipped": reason})
                continue
            try:
                record["cases"] += unit()
            except Exception as e:  # one unit's failure is its row; the next unit still runs
                traceback.print_exc()
                record["cases"].append({"case": label, "error": one_line(e)})
            longest = max(longest, time.time() - start)
            write_json(path, record)
        if built.summary:
            record["summary"] = built.summary(record["cases"])
        record["status"] = "partial" if any("error" in c for c in record["cases"]) else "ok"
    except Exception as e:
        traceback.print_exc()
        record.update(status="error", error=one_line(e))
    write_json(path, record)


def child_env(dry_run: bool) -> dict:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    if dry_run:  # the CPU, compiling fast: the dry run's timings mean nothing
        env["JAX_PLATFORMS"] = "cpu"
        env["XLA_FLAGS"] = " ".join(filter(None, [env.get("XLA_FLAGS"), DRY_RUN_XLA_FLAGS]))
    return env


def budget_of(part: str, args) -> float:
    """The part's share of --budget_s among the parts that run (env and --parts)."""
    return args.budget_s * SHARES[part] / sum(SHARES[p] for p in ("env", *args.parts))


def run_part(part: str, args, part_file: Path, log: Path, budget_s: float) -> dict:
    """The part in a child process under `budget_s`: its record, with how it ended."""
    command = [sys.executable, "-m", "experiments.gpu_check", f"--worker={part}", f"--part_file={part_file}"]
    command += [f"--deadline={time.time() + budget_s}"] + (["--dry-run"] if args.dry_run else [])
    start = time.perf_counter()
    with open(log, "w") as out:
        try:
            rc = subprocess.run(
                command, stdout=out, stderr=subprocess.STDOUT, env=child_env(args.dry_run), timeout=budget_s
            ).returncode
        except subprocess.TimeoutExpired:
            rc = None
    record = json.loads(part_file.read_text()) if part_file.exists() else {"cases": []}
    record.update(budget_s=budget_s, wall_seconds=time.perf_counter() - start, log=str(log))
    if rc is None:
        record.update(status="timeout", error=f"stopped at its budget of {budget_s:.0f} s")
    elif rc != 0 or record.get("status") == "running":
        tail = log.read_text().strip().splitlines()[-1:] or ["no output"]
        record.update(status="crashed", error=f"exit status {rc}: {tail[0]}")
    return record


def check_backend(args) -> tuple[dict, str]:
    """The env part (its record and log), run before anything is written; without a GPU (and not
    --dry-run) one line, exit 2."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        record = run_part("env", args, tmp / "env.json", tmp / "env.log", budget_of("env", args))
        log = (tmp / "env.log").read_text()
    if record["status"] != "ok":
        errors = [c["error"] for c in record["cases"] if "error" in c]
        fail(f"jax did not start: {record.get('error') or errors[0]}")
    device = record["cases"][0]
    if device["platform"] != "gpu" and not args.dry_run:
        fail(f"jax runs on {device['platform']} ({device['device_kind']}), not a GPU: {NO_GPU_HINT}")
    return record, log


def cell(value) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:,.4g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def rounded(value):
    """Floats to 4 significant digits, inside dicts and lists too."""
    if isinstance(value, float):
        return float(f"{value:.4g}")
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    return [rounded(v) for v in value] if isinstance(value, list) else value


def table_row(part: str, row: dict) -> dict:
    """The row with the derived cells its table shows."""
    derived = dict(row)
    if part == "env":
        derived["memory_gib"] = row["memory_bytes"] and row["memory_bytes"] / 2**30
        derived["peak_tflops"] = row["peak_flops"] and row["peak_flops"] / 1e12
    if part == "attention" and "max_rel_err" in row:
        derived["worst_err"] = max(row["max_rel_err"].values())
    if part == "prefill" and "seconds" in row:
        derived["exact_ms"], derived["jacobi_ms"] = 1e3 * row["exact_seconds"], 1e3 * row["seconds"]
    if part == "train" and row.get("mfu") is not None:
        derived["mfu"] = f"{row['mfu']:.1%}"
    return derived


def render(payload: dict) -> str:
    meta = payload["meta"]
    lines = [
        "# GPU check"
        + (" (dry run: tiny sizes on the CPU, timings mean nothing)" if meta["dry_run"] else ""),
        "",
        f"`{meta['command']}` on {meta['device']}; {meta['wall_seconds']:.0f} s of a "
        f"{meta['budget_s']:.0f} s budget.",
    ]
    sizes = next(iter(payload["parts"]["env"]["cases"]), {}).get("sizes", {})
    lines += ["", *(f"- {k}: {v}" for k, v in sizes.items())]
    for part, record in payload["parts"].items():
        columns = COLUMNS[part]
        lines += [
            "",
            f"## {part}: {record['status']} ({record['wall_seconds']:.0f} s of {record['budget_s']:.0f} s)",
            "",
            "| " + " | ".join([h for h, _ in columns] + ["note"]) + " |",
            "|" + "---|" * (len(columns) + 1),
        ]
        for row in map(lambda r: table_row(part, r), record["cases"]):
            note = row.get("error") or row.get("skipped") or ""
            lines.append("| " + " | ".join([cell(row.get(key)) for _, key in columns] + [note]) + " |")
        if record.get("error"):
            lines += ["", f"- part: {record['error']}"]
        lines += [""] if record.get("summary") else []
        lines += [
            f"- {key}: {json.dumps(rounded(value))}" for key, value in record.get("summary", {}).items()
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.worker:
        worker(args.worker, args.sizes, Path(args.part_file), args.deadline)
        return {}
    started, started_utc = time.perf_counter(), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    env_record, env_log = check_backend(args)
    out = Path(args.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    (out / "parts").mkdir(exist_ok=True)
    (out / "logs" / "env.log").write_text(env_log)
    env_record["log"] = str(out / "logs" / "env.log")
    device = env_record["cases"][0]
    payload = {
        "meta": {
            "command": " ".join([COMMAND, *argv]),
            "dry_run": args.dry_run,
            "device": f"{device['platform']}: {device['device_kind']}",
            "budget_s": args.budget_s,
            "parts": ["env", *args.parts],
            "started_utc": started_utc,
            "wall_seconds": time.perf_counter() - started,
        },
        "parts": {"env": env_record},
    }
    spare = env_record["budget_s"] - env_record["wall_seconds"]
    for part in args.parts:
        budget = budget_of(part, args) + max(spare, 0.0)
        record = run_part(part, args, out / "parts" / f"{part}.json", out / "logs" / f"{part}.log", budget)
        spare = budget - record["wall_seconds"]
        payload["parts"][part] = record
        payload["meta"]["wall_seconds"] = time.perf_counter() - started
        write_json(out / "gpu_check.json", payload)
        (out / "gpu_check.md").write_text(render(payload))
    markdown = render(payload)
    print(markdown)
    failed = [p for p, r in payload["parts"].items() if r["status"] != "ok"]
    if failed:
        print(f"gpu_check: parts not ok: {', '.join(failed)} (see {out / 'logs'})", file=sys.stderr)
        raise SystemExit(1)
    return payload
