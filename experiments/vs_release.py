#!/usr/bin/env python
"""This framework against the authors' PyTorch release (princeton-pli/T2MLR), side by side on one config:
SmolLM2-135M shapes, random init, fp32, T²MLR at the paper's window (13,18) (code l_start 12, l_end 17),
gated mixer, Jacobi D = 16, B = 4, temporal residual on (configs/smollm135m_t2mlr.py:w13_18), on the CPU.
Rows: the T²MLR train step (forward + backward + clipped AdamW step) on one row of 256 tokens, the same for
the plain backbone (no recurrence, not widened), greedy decode of 64 new tokens (tok/s, prefill included)
after a 16-token prompt (recurrent, exact prefill) for both, and each whole run's peak RSS.

Each side runs in a process of its own, `--rounds` times, interleaved (release, ours, release, ours, ...):
  release  experiments/benchmarks/vs_release_torch.py run by --release_python (torch, transformers 4.57):
           the release's T2MLRWrapper built as its src/train.py does, its train() forward (Jacobi), a
           torch fused AdamW step, HF generate(); T²MLR off is the release's own baseline wrapper
  ours     experiments/benchmarks/vs_release_ours.py: the trainer's compiled step
           (t2mlr_jax.train.train_step) and the architecture's cached generate, the blocks' weights held
           per layer (model.scan_layers=False, as the release's modules hold them), compiled ahead of
           time (compile time reported apart), JAX on the CPU, no persistent compilation cache
Both run on the same --threads CPUs (torch.set_num_threads and the process's CPU affinity, by which XLA
sizes its thread pools), time --repeats calls per row after one warm-up call, and report their peak RSS
(getrusage). Per round, each row's ratio is taken between the two runs of that round; the table shows
medians over rounds.

  python -m experiments.vs_release --release_src=../T2MLR --release_python=../release_venv/bin/python
  python -m experiments.vs_release --release_src=../T2MLR --release_python=... --rounds=2 --quick

Without --release_src it prints how to get the release and exits 2. Writes, in --out (default
runs/vs_release):
  results.json  meta (command, versions, spec), the summary rows and every run's raw timings
  results.md    the table and our compile times; also printed
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tqdm import tqdm

from experiments.analysis_common import OneLineParser, fail
from experiments.benchmarks import vs_release_ours, vs_release_torch
from experiments.benchmarks.report import environment, markdown_table, size, times

ROOT = Path(__file__).resolve().parents[1]
COMMAND = "python -m experiments.vs_release"
DRIVERS = {"release": vs_release_torch.__name__, "ours": vs_release_ours.__name__}  # run with -m from ROOT
TRAIN = {"batch": 1, "seq_len": 256}
DECODE = {"batch": 1, "prompt_len": 16}
QUICK_TOKENS = 16  # --quick: new tokens per decode
HOW_TO = """\
vs_release.py times the authors' PyTorch release against this framework; it needs their code:
  git clone https://github.com/princeton-pli/T2MLR ../T2MLR
  python3 -m venv ../release_venv
  ../release_venv/bin/pip install torch==2.13.0 'transformers==4.57.*' accelerate
  python -m experiments.vs_release --release_src=../T2MLR --release_python=../release_venv/bin/python
The release does not import as shipped; its driver (experiments/benchmarks/vs_release_torch.py) applies two
import shims in its own process, via sys.modules:
ROOT = Path(__file__).resolve().parents[1]
  sys.modules["IPython"] = a stub module with embed()
  sys.modules["components.t2mlr_utils"] = components.rcot_utils"""
NAMES = {  # program -> row name
    "t2mlr_train": "T²MLR train step",
    "plain_train": "plain train step",
    "t2mlr_decode": "T²MLR greedy decode",
    "plain_decode": "plain greedy decode",
}
PROGRAMS = tuple(NAMES)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = OneLineParser(
        prog=COMMAND, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--release_src", help="a checkout of princeton-pli/T2MLR (required; see above)")
    parser.add_argument(
        "--release_python",
        default=sys.executable,
        help="a Python with torch and transformers 4.57 to run the release (default: this one)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="runs of each side, interleaved (default 3)")
    parser.add_argument("--repeats", type=int, help="timed calls per row and run (default 2; --quick 1)")
    parser.add_argument(
        "--new_tokens", type=int, help=f"tokens per decode (default 64; --quick {QUICK_TOKENS})"
    )
    parser.add_argument("--quick", action="store_true", help="fewer decode tokens and one timed call per row")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads of each side (default 2)")
    parser.add_argument("--seed", type=int, default=0, help="weights and token draws, both sides (default 0)")
    parser.add_argument("--out", default="runs/vs_release", help="output directory (default runs/vs_release)")
    args = parser.parse_args(argv)
    args.repeats = args.repeats or (1 if args.quick else 2)
    args.new_tokens = args.new_tokens or (QUICK_TOKENS if args.quick else 64)
    return args


def check(args: argparse.Namespace) -> None:
    """The release checkout, its Python and the counts, before anything runs."""
    vs_release_torch.check_release(args.release_src, args.release_python)
    for flag in ("rounds", "repeats", "new_tokens", "threads"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag} must be >= 1, got {getattr(args, flag)}")


def make_spec(args: argparse.Namespace) -> dict:
    """What both drivers read: our config's shapes and settings, the workload, threads and seed."""
    return {
        **vs_release_ours.spec_of(vs_release_ours.config()),
        "train": TRAIN,
        "decode": {**DECODE, "new_tokens": args.new_tokens},
        "repeats": args.repeats,
        "threads": args.threads,
        "seed": args.seed,
        "release_src": str(Path(args.release_src).resolve()),
    }


def run_side(side: str, python: str, spec: dict) -> dict:
    """One run of a side's driver in its own process: its JSON line."""
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "JAX_ENABLE_COMPILATION_CACHE": "false",  # compile times are compile times
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    done = subprocess.run(
        [python, "-m", DRIVERS[side], json.dumps(spec)], capture_output=True, text=True, env=env, cwd=ROOT
    )
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"the {side} run failed (exit status {done.returncode}): {last}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------- report


def summarize(runs: list[dict]) -> dict:
    """Per program: each side's median over rounds of its per-run median seconds, and the median over rounds
    of release / ours seconds (> 1: ours faster); per side the peak RSS, and ours / release RSS; our
    compile seconds and each side's whole-run wall seconds."""
    rounds = sorted({r["round"] for r in runs})
    by = {(r["round"], r["side"]): r for r in runs}
    pairs = [(by[i, "release"], by[i, "ours"]) for i in rounds]
    med = statistics.median

    def seconds(run: dict, program: str) -> float:
        return med(run["programs"][program]["seconds"])

    rows = {}
    for program in PROGRAMS:
        ratios = [seconds(rel, program) / seconds(ours, program) for rel, ours in pairs]
        rows[program] = {
            "release_s": med(seconds(rel, program) for rel, _ in pairs),
            "ours_s": med(seconds(ours, program) for _, ours in pairs),
            "speed_ratio": med(ratios),
            "speed_ratios": ratios,  # per round
            "new_tokens": pairs[0][1]["programs"][program].get("new_tokens"),
            "params": {
                side: pairs[0][i]["programs"][program]["params"] for i, side in enumerate(("release", "ours"))
            },
            "compile_s": med(ours["programs"][program]["compile_s"] for _, ours in pairs),
        }
    rows["peak_rss"] = {
        "release_bytes": med(rel["peak_rss_bytes"] for rel, _ in pairs),
        "ours_bytes": med(ours["peak_rss_bytes"] for _, ours in pairs),
        "ours_over_release": med(ours["peak_rss_bytes"] / rel["peak_rss_bytes"] for rel, ours in pairs),
    }
    rows["wall"] = {f"{side}_s": med(by[i, side]["wall_s"] for i in rounds) for side in ("release", "ours")}
    return rows


def render(meta: dict, summary: dict) -> str:
    spec = meta["spec"]
    t, d, r, m = spec["train"], spec["decode"], spec["recurrence"], spec["model"]
    n = d["new_tokens"]
    setting = (
        f"{m['num_layers']} layers x {m['hidden_size']}, code l_start {r['l_start']}, l_end {r['l_end']}, "
        f"gated mixer, Jacobi D {r['d_forward']}, B {r['d_backward']}, "
        f"temporal residual {'on' if r['temporal_residual'] else 'off'}"
    )
    details = {
        "t2mlr_train": f" (fwd + bwd + AdamW, {t['batch']} × {t['seq_len']} tokens)",
        "plain_train": " (same backbone, no recurrence)",
        "t2mlr_decode": f", batch {d['batch']}, {d['prompt_len']}-token prompt + {n} new (tok/s)",
        "plain_decode": " (tok/s)",
    }
    rows = []
    for program in PROGRAMS:
        row = summary[program]
        if program.endswith("train"):
            cells = [f"{row['release_s']:.2f} s", f"{row['ours_s']:.2f} s"]
        else:
            cells = [f"{row['new_tokens'] / row[f'{side}_s']:.1f}" for side in ("release", "ours")]
        spread = sorted(row["speed_ratios"])
        ratio = times(row["speed_ratio"], 2) + (
            f" ({spread[0]:.2f}–{spread[-1]:.2f})" if len(spread) > 1 else ""
        )
        rows.append([NAMES[program] + details[program], *cells, ratio])
    rss = summary["peak_rss"]
    rows.append(
        [
            "peak memory of each whole run (RSS)",
            size(rss["release_bytes"]),
            size(rss["ours_bytes"]),
            f"RSS {times(rss['ours_over_release'], 2)}",
        ]
    )
    wall, versions = summary["wall"], meta["versions"]
    params = {p: summary[p]["params"] for p in ("t2mlr_train", "plain_train")}
    notes = [
        "speed: release time / ours time, the median over rounds of each round's ratio, in brackets the "
        "lowest and highest round (> 1: ours faster); "
        "RSS: ours / release (< 1: ours smaller). Times are medians of each run's timed calls, after a "
        "warm-up call; decode tok/s counts new tokens over the whole generate() call, prefill included.",
        f"parameters, release / ours: T²MLR {params['t2mlr_train']['release']:,} / "
        f"{params['t2mlr_train']['ours']:,}; plain {params['plain_train']['release']:,} / "
        f"{params['plain_train']['ours']:,}",
        f"whole run (imports, builds, compiles, warm-ups, timed calls): release {wall['release_s']:.0f} s, "
        f"ours {wall['ours_s']:.0f} s",
        f"{meta['threads']} thread(s) per side; {meta['rounds']} rounds x {meta['repeats']} timed call(s); "
        f"release {meta['release_src']} ({meta['release_commit']}), torch {versions['release']['torch']}, "
        f"transformers {versions['release']['transformers']}; ours jax {versions['ours']['jax']} on "
        f"{versions['ours']['device']}",
    ]
    compile_rows = [[NAMES[p], f"{summary[p]['compile_s']:.1f}"] for p in PROGRAMS]
    return "\n".join(
        [
            "# T²MLR: this framework vs the authors' release",
            "",
            f"`{meta['command']}`: {meta['preset']} ({setting}), random init, fp32, on the CPU.",
            "",
            markdown_table(["", "release", "ours", "ours/release speed"], rows),
            "",
            *(f"- {note}" for note in notes),
            "",
            "## Our compile times (the release runs eagerly)",
            "",
            markdown_table(["program", "compile s"], compile_rows),
            "",
        ]
    )


def write_results(out: Path, meta: dict, runs: list[dict]) -> str:
    """results.json and results.md in `out`; the markdown."""
    summary = summarize(runs)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"meta": meta, "summary": summary, "runs": runs}, indent=1))
    markdown = render(meta, summary)
    (out / "results.md").write_text(markdown)
    return markdown


# ---------------------------------------------------------------------------------------------- main


def release_commit(src: str) -> str:
    """The checkout's commit, or why there is none (an exported tree)."""
    if not (Path(src) / ".git").exists():
        return "no git metadata"
    done = subprocess.run(["git", "-C", src, "rev-parse", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "no git metadata"


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.release_src is None:
        print(HOW_TO)
        fail("--release_src is required: a checkout of princeton-pli/T2MLR (how to get one: above)")
    started = time.time()
    try:
        check(args)
        spec = make_spec(args)
    except ValueError as e:
        fail(e)
    runs = []
    try:  # the bar is closed before a failed run's error line
        with tqdm(total=2 * args.rounds, unit="run", file=sys.stderr) as bar:
            for i in range(args.rounds):
                for side, python in (("release", args.release_python), ("ours", sys.executable)):
                    bar.set_description(f"round {i + 1}/{args.rounds}: {side}")
                    runs.append({"round": i, **run_side(side, python, spec)})
                    bar.update()
    except RuntimeError as e:
        fail(e)
    meta = {
        **environment(vs_release_ours.CONFIG, COMMAND, argv),
        "spec": spec,
        "rounds": args.rounds,
        "repeats": args.repeats,
        "threads": args.threads,
        "release_src": args.release_src,
        "release_commit": release_commit(args.release_src),
        "versions": {
            side: next(r["versions"] for r in runs if r["side"] == side) for side in ("release", "ours")
        },
        "wall_seconds": round(time.time() - started, 1),
    }
    markdown = write_results(Path(args.out), meta, runs)
    print(markdown)
    return {"meta": meta, "runs": runs}


if __name__ == "__main__":
    main()
