"""This framework against an authors' PyTorch release, side by side on the CPU, random init, fp32.
--release picks the release and its pair of drivers (t2mlr_jax/studies/benchmarks/vs_*.py, each side's
docstring says exactly what it runs):
  t2mlr      princeton-pli/T2MLR (default): SmolLM2-135M shapes, T²MLR at the paper's window (13,18) (code
             l_start 12, l_end 17), gated mixer, Jacobi D = 16, B = 4, temporal residual on
             (configs/smollm135m_t2mlr.py:w13_18), and the plain backbone (no recurrence, not widened);
             vs_release_torch.py (torch, transformers 4.57) / vs_release_ours.py
  lrt        OoDBag/Latent_recurrent_transformer: its recurrent GPT (use_interleaved, its parallel
             interleaved training, its sequential recurrence per decoded token) against our "lrt" arch
             (multi-refinement, the same number of passes), and its vanilla GPT against our transformer,
             on a small nanochat backbone (vs_lrt_ours.GPT); vs_lrt_torch.py / vs_lrt_ours.py
  ponderlm2  LUMIA-Group/PonderLM-2: its PonderLM-2 Llama (K = 1 thought, 3 Jacobi iterations; K + 1
             forwards per decoded token) against our "ponderlm2" arch, and stock transformers Llama against
             our transformer, at llama_config/125m scaled down (vs_ponderlm2_ours.LLAMA);
             vs_ponderlm2_torch.py (transformers <= 4.46.1) / vs_ponderlm2_ours.py
Rows: each model's train step (forward + backward + optimizer step) on one row of 256 tokens, its greedy
decode of 64 new tokens (tok/s, prefill included) after a 16-token prompt, and each whole run's peak RSS.

Each side runs in a process of its own, `--rounds` times, interleaved (release, ours, release, ours, ...):
  release  the release's driver, run by --release_python: the release's own modules imported from
           --release_src, run eagerly (what each compiles: its page's note)
  ours     our driver: the trainer's compiled step (t2mlr_jax.train.train_step) and the architecture's
           cached generate, the blocks' weights held per layer (model.scan_layers=False, as the release's
           modules hold them), compiled ahead of time (compile time reported apart), JAX on the CPU; the
           first round compiles into an empty compilation cache (OUT/jax_cache), the later ones load from it
Both run on the same --threads CPUs (torch.set_num_threads and the process's CPU affinity, by which XLA
sizes its thread pools), time --repeats calls per row after one warm-up call, and report their peak RSS
(getrusage). Per round, each row's ratio is taken between the two runs of that round; the table shows
medians over rounds.

  python -m experiments.vs_release --release_src=../T2MLR --release_python=../release_venv/bin/python
  python -m experiments.vs_release --release_src=../T2MLR --release_python=... --rounds=2 --quick
  PYTHONPATH=../relpkgs python -m experiments.vs_release --release lrt --release_src=../lrt_release
  python -m experiments.vs_release --release ponderlm2 --release_src=../PonderLM-2 \
      --release_python=../pl2_venv/bin/python

Without --release_src it prints how to get the release and exits 2. Writes, in --out (default
runs/vs_release, runs/vs_release_RELEASE for the others):
  results.json  meta (command, release, versions, spec), the summary rows and every run's raw timings
  results.md    the table, with our compile times, and with --profile the slowest ops; also printed
  profile/      with --profile, our train programs' traces (TensorBoard's profile plugin, Perfetto)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

from tqdm import tqdm

from t2mlr_jax.analysis.profile_ops import newest_trace, ops_lines, slowest_ops
from t2mlr_jax.config.cli import OneLineParser, fail
from t2mlr_jax.config.sections import profile_window
from t2mlr_jax.storage.workdir import PROFILE
from t2mlr_jax.studies import ROOT
from t2mlr_jax.studies.benchmarks import (
    vs_lrt_ours,
    vs_lrt_torch,
    vs_ponderlm2_ours,
    vs_ponderlm2_torch,
    vs_release_ours,
    vs_release_torch,
)
from t2mlr_jax.studies.benchmarks.report import environment, markdown_table, size, times

COMMAND = "python -m experiments.vs_release"
COMPILATION_CACHE = "jax_cache"  # in --out: our side's compiled programs, emptied at the start of a run
QUICK_TOKENS = 16  # --quick: new tokens per decode


@dataclasses.dataclass(frozen=True)
class Pair:
    """One release's two drivers (each its ENTRY_POINT, run with -m from ROOT) and how its page reads.
    The release's driver (stdlib at import) has REPO, HOW_TO and check_release(src, python); ours has
    CONFIG, TITLE, MODELS (program prefix -> label, in table order), TRAIN, DECODE, model_spec() (what both
    drivers build from), setting(spec) (one line) and details(spec) (program -> what its row adds to its
    name)."""

    release: ModuleType
    ours: ModuleType
    compile_note: str  # the heading of our compile times: what the release compiles

    @property
    def programs(self) -> tuple[str, ...]:
        return tuple(f"{m}_{kind}" for kind in ("train", "decode") for m in self.ours.MODELS)

    def name(self, program: str) -> str:
        model, kind = program.rsplit("_", 1)
        return f"{self.ours.MODELS[model]} {'train step' if kind == 'train' else 'greedy decode'}"


RELEASES = {
    "t2mlr": Pair(vs_release_torch, vs_release_ours, "the release runs eagerly"),
    "lrt": Pair(vs_lrt_torch, vs_lrt_ours, "the release runs eagerly but for its Muon / AdamW steps"),
    "ponderlm2": Pair(vs_ponderlm2_torch, vs_ponderlm2_ours, "the release runs eagerly"),
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = OneLineParser(prog=COMMAND, description=__doc__)
    parser.add_argument(
        "--release",
        default="t2mlr",
        choices=list(RELEASES),
        help="which release: t2mlr (princeton-pli/T2MLR), lrt (OoDBag/Latent_recurrent_transformer) or "
        "ponderlm2 (LUMIA-Group/PonderLM-2); default t2mlr",
    )
    parser.add_argument("--release_src", help="a checkout of the release (required; see above)")
    parser.add_argument(
        "--release_python",
        default=sys.executable,
        help="a Python that runs the release: torch, and for t2mlr transformers 4.57, for ponderlm2 "
        "transformers <= 4.46.1 (default: this one)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="runs of each side, interleaved (default 3)")
    parser.add_argument("--repeats", type=int, help="timed calls per row and run (default 2; --quick 1)")
    parser.add_argument(
        "--new_tokens", type=int, help=f"tokens per decode (default 64; --quick {QUICK_TOKENS})"
    )
    parser.add_argument("--quick", action="store_true", help="fewer decode tokens and one timed call per row")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads of each side (default 2)")
    parser.add_argument("--seed", type=int, default=0, help="weights and token draws, both sides (default 0)")
    parser.add_argument(
        "--out", help="output directory (default runs/vs_release; runs/vs_release_RELEASE but for t2mlr)"
    )
    parser.add_argument(
        "--profile",
        default="",
        help="START:STOP: after its timed calls, our side runs each train step STOP - 1 more times, tracing "
        "calls START .. STOP - 1 (jax.profiler) into OUT/profile/<program>/; results.md names their slowest "
        "ops",
    )
    args = parser.parse_args(argv)
    args.out = args.out or "runs/vs_release" + ("" if args.release == "t2mlr" else f"_{args.release}")
    args.repeats = args.repeats or (1 if args.quick else 2)
    args.new_tokens = args.new_tokens or (QUICK_TOKENS if args.quick else 64)
    return args


def check(args: argparse.Namespace) -> None:
    """The release checkout, its Python and the counts, before anything runs."""
    RELEASES[args.release].release.check_release(args.release_src, args.release_python)
    for flag in ("rounds", "repeats", "new_tokens", "threads"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag} must be >= 1, got {getattr(args, flag)}")


def make_spec(args: argparse.Namespace) -> dict:
    """What both drivers read: our config's shapes and settings, the workload, threads and seed."""
    ours = RELEASES[args.release].ours
    return {
        **ours.model_spec(),
        "train": ours.TRAIN,
        "decode": {**ours.DECODE, "new_tokens": args.new_tokens},
        "repeats": args.repeats,
        "threads": args.threads,
        "seed": args.seed,
        "release_src": str(Path(args.release_src).resolve()),
        "profile": profile_window("--profile", args.profile),
        "profile_dir": str(Path(args.out).resolve() / PROFILE),
        "compilation_cache": str(Path(args.out).resolve() / COMPILATION_CACHE),
    }


def run_side(pair: Pair, side: str, python: str, spec: dict) -> dict:
    """One run of a side's driver in its own process: its JSON line."""
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        # one compiled program shared between the rounds: the first compiles (into an empty cache), the
        # later ones load it, as the release's torch.compile loads from its inductor cache
        "JAX_ENABLE_COMPILATION_CACHE": "true",
        "JAX_COMPILATION_CACHE_DIR": spec["compilation_cache"],
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    command = [python, "-m", getattr(pair, side).ENTRY_POINT, json.dumps(spec)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"the {side} run failed (exit status {done.returncode}): {last}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------- report


def summarize(pair: Pair, runs: list[dict]) -> dict:
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
    for program in pair.programs:
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
            "compile_s": pairs[0][1]["programs"][program]["compile_s"],  # the first round's: cold
            "cached_compile_s": med(ours["programs"][program]["compile_s"] for _, ours in pairs[1:])
            if len(pairs) > 1
            else None,
        }
    rows["peak_rss"] = {
        "release_bytes": med(rel["peak_rss_bytes"] for rel, _ in pairs),
        "ours_bytes": med(ours["peak_rss_bytes"] for _, ours in pairs),
        "ours_over_release": med(ours["peak_rss_bytes"] / rel["peak_rss_bytes"] for rel, ours in pairs),
        # the first round compiles (its peak includes the compiler's scratch), the later ones load
        "first_round_ours_over_release": pairs[0][1]["peak_rss_bytes"] / pairs[0][0]["peak_rss_bytes"],
    }
    rows["wall"] = {f"{side}_s": med(by[i, side]["wall_s"] for i in rounds) for side in ("release", "ours")}
    rows["wall"]["first_round_ours_s"] = pairs[0][1]["wall_s"]
    return rows


def render(pair: Pair, meta: dict, summary: dict) -> str:
    spec = meta["spec"]
    details = pair.ours.details(spec)
    rows = []
    for program in pair.programs:
        row = summary[program]
        if program.endswith("train"):
            cells = [f"{row['release_s']:.2f} s", f"{row['ours_s']:.2f} s"]
        else:
            cells = [f"{row['new_tokens'] / row[f'{side}_s']:.1f}" for side in ("release", "ours")]
        spread = sorted(row["speed_ratios"])
        ratio = times(row["speed_ratio"], 2) + (
            f" ({spread[0]:.2f}–{spread[-1]:.2f})" if len(spread) > 1 else ""
        )
        rows.append([pair.name(program) + details[program], *cells, ratio, f"{row['compile_s']:.1f} s"])
    rss, wall = summary["peak_rss"], summary["wall"]
    rows.append(
        [
            "peak memory of each whole run (RSS)",
            size(rss["release_bytes"]),
            size(rss["ours_bytes"]),
            f"RSS {times(rss['ours_over_release'], 2)} "
            f"(compiling: {times(rss['first_round_ours_over_release'], 2)})",
            "",
        ]
    )
    rows.append(
        [
            "whole run (imports, builds, compiles, warm-ups, timed calls)",
            f"{wall['release_s']:.0f} s",
            f"{wall['ours_s']:.0f} s (compiling: {wall['first_round_ours_s']:.0f} s)",
            times(wall["release_s"] / wall["ours_s"], 2),
            f"{sum(summary[p]['compile_s'] for p in pair.programs):.1f} s",
        ]
    )
    versions = meta["versions"]
    cached_s = [summary[p]["cached_compile_s"] for p in pair.programs]
    cached = f" ({sum(cached_s):.1f} s for the four)" if None not in cached_s else ""
    counts = {label: summary[f"{m}_train"]["params"] for m, label in pair.ours.MODELS.items()}
    params = "; ".join(f"{label} {n['release']:,} / {n['ours']:,}" for label, n in counts.items())
    release_versions = ", ".join(
        f"{package} {versions['release'][package]}"
        for package in ("torch", "transformers")
        if package in versions["release"]
    )
    notes = [
        "speed: release time / ours time, the median over rounds of each round's ratio, in brackets the "
        "lowest and highest round (> 1: ours faster); "
        "RSS: ours / release (< 1: ours smaller; in brackets the first round's, whose peak includes our "
        "compiler's scratch). Times are medians of each run's timed calls, after a "
        "warm-up call; decode tok/s counts new tokens over the whole generate() call, prefill included. "
        "our compile: each program's lowering and XLA compilation in the first round, excluded from its "
        f"times ({pair.compile_note}); the later rounds load them from JAX's compilation cache{cached}.",
        f"parameters, release / ours: {params}",
        f"{meta['threads']} thread(s) per side; {meta['rounds']} rounds x {meta['repeats']} timed call(s); "
        f"release {meta['release_src']} ({meta['release_commit']}), {release_versions}; "
        f"ours jax {versions['ours']['jax']} on {versions['ours']['device']}",
    ]
    return "\n".join(
        [
            f"# {pair.ours.TITLE}",
            "",
            f"`{meta['command']}`: {meta['preset']} ({pair.ours.setting(spec)}), random init, fp32, "
            "on the CPU.",
            "",
            markdown_table(["", "release", "ours", "ours/release speed", "our compile"], rows),
            "",
            *(f"- {note}" for note in notes),
            "",
            *profiled(pair, meta),
        ]
    )


def profiled(pair: Pair, meta: dict) -> list[str]:
    """The slowest ops of each train program's --profile trace (the last round's), as markdown lines."""
    spec, lines = meta["spec"], []
    if not spec.get("profile"):
        return lines
    for program in pair.programs:
        trace = newest_trace(Path(spec["profile_dir"]) / program)
        if trace:
            lines += [
                f"## {pair.name(program)}: profile",
                "",
                "```",
                *ops_lines(slowest_ops(trace)),
                "```",
                "",
            ]
    return lines


def write_results(out: Path, meta: dict, runs: list[dict]) -> str:
    """results.json and results.md in `out`; the markdown."""
    pair = RELEASES[meta["release"]]
    summary = summarize(pair, runs)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"meta": meta, "summary": summary, "runs": runs}, indent=1))
    markdown = render(pair, meta, summary)
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
    pair = RELEASES[args.release]
    if args.release_src is None:
        print(pair.release.HOW_TO)
        fail(f"--release_src is required: a checkout of {pair.release.REPO} (how to get one: above)")
    started = time.time()
    try:
        check(args)
        spec = make_spec(args)
    except ValueError as e:
        fail(e)
    shutil.rmtree(spec["compilation_cache"], ignore_errors=True)  # the first round compiles
    runs = []
    try:  # the bar is closed before a failed run's error line
        with tqdm(total=2 * args.rounds, unit="run", file=sys.stderr) as bar:
            for i in range(args.rounds):
                for side, python in (("release", args.release_python), ("ours", sys.executable)):
                    bar.set_description(f"round {i + 1}/{args.rounds}: {side}")
                    runs.append({"round": i, **run_side(pair, side, python, spec)})
                    bar.update()
    except RuntimeError as e:
        fail(e)
    meta = {
        **environment(pair.ours.CONFIG, COMMAND, argv),
        "release": args.release,
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
