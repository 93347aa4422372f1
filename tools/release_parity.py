#!/usr/bin/env python
"""Parity of our import / export with a published release, run against the release's OWN code.

  PYTHONPATH=/tmp/relpkgs python tools/release_parity.py --release lrt --release_src /tmp/lrt_rel \
      [--release_python PY] [--sizes tiny,d12] [--out parity/]
  python tools/release_parity.py --release t2mlr --release_src /tmp/t2mlr_rel \
      --release_python /tmp/t2venv/bin/python --out parity_t2/

For each size, the release's model is built IN THE RELEASE'S CODE, in a process of its own run by
--release_python (the environment, PYTHONPATH included, is passed on), with a random init, saved in its
checkpoint format and run there; then here:
  1. release  the release's driver (lrt: experiments/make_nanochat_fixture.py, nanochat:
              experiments/make_karpathy_nanochat_fixture.py, t2mlr: experiments/make_release_fixture.py;
              --size SIZE) writes
              OUT/SIZE/release/: model/ (the release's checkpoint) and release.npz (its tokens, logits,
              loss, every parameter's gradient and its cached decode; log in OUT/SIZE/release.log)
  2. ours     that checkpoint is imported through ours (load_pretrained) and our logits, loss, gradients
              (mapped to the release's keys) and cached decode compared with the release's, fp32
  3. export   ours is written back in the release's format (OUT/SIZE/export/) and its state dict compared
              with the release's, bitwise on every real row (the vocabulary tables' padded rows, never
              read, are zeros in ours where the release keeps what it drew)
  4. reload   the release's own loader and forward run on that export (the driver's --logits_of:
              OUT/SIZE/export_logits.npz); its logits compared with the release's on its own checkpoint
  (ponderlm2: experiments/make_ponderlm2_fixture.py; its folder is save_pretrained's HF Llama with the
  release's pondering fields, imported as our arch ponderlm2 with the release's settings
  (t2mlr_jax/architectures/ponderlm2/release.py); its release.npz adds eval_logits, its evaluation forward,
  compared with ours as "eval"; its decode is the logits from the prefill's last token on; no padded rows)
Sizes (ponderlm2): tiny, the fixture's model (2 layers, width 32, vocab 64, K = 2; tokens 2 x 8, prefill
2), and 410m, llama_config/410m at K = 1 as scripts/train_ponderlm2_llama_410m.sh (~405M parameters;
tokens 1 x 16, prefill 2; several GB of memory, minutes); its baselines, imported as our looped and pause:
tiny_loop, 410m_loop (K = 3 as scripts/train_loop_llama_410m.sh) and tiny_pause (K = 3; its only script
trains 1.4b).
Sizes (lrt): tiny, the fixture's model (4 layers, width 64, vocab 100; tokens 2 x 12, prefill 4), and
d12, the release's default GPTConfig (12 layers, width 768, 6 heads, vocab 32768, context 2048, windows
"SSSL"; about 286M parameters; tokens 1 x 64, prefill 8; a few GB of memory and disk, a few minutes);
each also as the release's recurrent GPT (tiny_interleaved, d12_interleaved: use_interleaved=True, our
LRT), whose inference is its sequential loop (a token per call fed the previous h_final): that is both the
logits and the decode compared, with our exact recurrence and our cached decode; and whose training step
is its parallel interleaved training (a full pass, then interleaved_num_passes passes over every N-th
position): each pass's logits, the loss and every gradient compared with our lrt.training="interleaved",
and with its KV refresh (interleaved_kv_refresh) each pass's logits and the loss.
Sizes (t2mlr, the authors' T²MLR release princeton-pli/T2MLR; its Python needs transformers 4.56/4.57):
tiny, tests/interop/fixtures/release_default's model (a Llama of 4 layers, width 32, vocab 64; window
l_start 1, l_end 2, gated mixer, the release's default D = 1, B = 10^7; tokens 2 x 12, prefill 4), and
smollm135m, the paper's smallest: SmolLM2-135M's shapes at the window (13,18) (code l_start 12, l_end 17),
gated mixer with W_rec, temporal residual, Jacobi D = 16, B = 4 (configs/smollm135m_t2mlr.py:w13_18; about
136M parameters; tokens 1 x 64, prefill 16; about 4 GB of memory, some 15 minutes on 2 busy cores). Every
position is recurrent. The logits are its eval() forward (exact sequential recurrence) against our
exact_forward; its train() forward (the Jacobi iteration) against our jacobi_forward (train_logits:0,
held as the logits are), whose loss and gradients are compared; the decode is its generate()'s path (an exact
prefill that returns the KV cache, then a token per call with its carried recurrent state) against our
cached decode.
Sizes (nanochat: karpathy/nanochat's own GPT, --release_src a checkout of it at
92d63d4 or near): tiny (3 layers, width 32, vocab 100, context 512; tokens 1 x 136, past its 128-key
window; prefill 4) and d12, its default GPTConfig (as lrt's d12, windows 768 / 2048; tokens 1 x 64).

Pass / fail, per size: each figure within its bound, derived from the depth of its path rather than
fixed (t2mlr_jax.studies.parity; fp32 round-off follows the instruction set XLA:CPU compiles for, so a
fixed bound that holds on one CPU fails on another): max |Δ| <= 4 x blocks x u x max |release logit| for
the logits, each training pass's and the cached decode, u = 2^-24 and blocks = 2 x layers + 2 on the
longest path from the tokens (a plain model's L layers; T²MLR's exact recurrence L + (T - 1) W over a
W-layer window, its Jacobi iteration L + D W; the LRT's sequential inference T L, its training (1 + N) L;
PonderLM-2's passes x L); each gradient within twice its training forward's blocks, relative to its
layer's largest |release gradient| (a parameter whose release gradient is all zero: max |Δ| <= 1e-10,
reported apart); |Δ loss| <= 2 x the training logits' bound + 4 u |loss|; the export's state dict equal
and the release's logits on it bitwise equal to those on its own checkpoint. Each figure's error / bound
is its "ratio", the table's "worst error / bound" the size's largest. At t2mlr's smollm135m (L 30, W 6, T
64, D 16) the logits' bound is 2.0e-4 of max |logit| (408 layers: the exact recurrence), the Jacobi
training forward's 6.1e-5 (126 layers) and the gradients' 1.2e-4; where a row has little room a float64
run of the release decides (docs/interop.md).

Writes OUT/parity.json (every figure, the release's commit, torch / jax versions, sizes, the command) and
OUT/parity.md (one table row per size), and prints the table. OUT must be new or empty, unless
--overwrite (which replaces OUT/SIZE/, parity.json and parity.md, nothing else). Exit status 0 when every
size passes, 1 when a check fails or the release fails to run, and 2 on bad input (one error line, before
anything is written): a missing checkout, one that is not the release, a --release_python that is not an
executable or cannot import the release, an unknown release or size.
"""

from __future__ import annotations

import importlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from t2mlr_jax import cpu_runtime
from t2mlr_jax.config.cli import OneLineParser

ROOT = Path(__file__).resolve().parents[1]
COMMAND = "python tools/release_parity.py"


@dataclass(frozen=True)
class Release:
    """A release we check: its driver (a module of t2mlr_jax.studies.fixtures, stdlib only at import, whose
    ENTRY_POINT, a module of experiments/, the release's Python runs with -m from the repo root) and what it
    offers. The driver provides check_release(src, python) (ValueError when `src` is not a checkout of the
    release), SIZES (name -> a Size with its decode's `prefill`), `--size NAME --out DIR` (DIR/model/ and
    DIR/release.npz) and `--logits_of CKPT --tokens_from NPZ --out DIR` (DIR/export_logits.npz)."""

    repo: str
    driver: str
    sizes: dict[str, str]  # size -> its label in the table
    probe: str  # Python run by --release_python from the repo root, the checkout first on sys.path (its path
    # sys.argv[1]): imports what it needs
    # Our side (a module of t2mlr_jax.studies): our_side(folder, prefill) -> (cfg, imported, figures),
    # export_side(folder, cfg, imported) -> (state figures, the release's parameter count) and
    # release_config(folder) -> the model config its checkpoint records.
    interop: str


RELEASES = {
    "lrt": Release(
        repo="OoDBag/Latent_recurrent_transformer",
        driver="t2mlr_jax.studies.fixtures.nanochat",
        sizes={
            "tiny": "tiny",
            "d12": "release default (d12)",
            "tiny_interleaved": "tiny, recurrent (interleaved)",
            "d12_interleaved": "d12, recurrent (interleaved)",
        },
        probe="from nanochat import checkpoint_manager, engine, gpt",
        interop="t2mlr_jax.studies.parity",
    ),
    "ponderlm2": Release(
        repo="LUMIA-Group/PonderLM-2",
        driver="t2mlr_jax.studies.fixtures.ponderlm2",
        sizes={
            "tiny": "tiny (K = 2)",
            "410m": "llama_config/410m (K = 1)",
            "tiny_loop": "tiny, its loop baseline (K = 3: 4 x the stack)",
            "tiny_pause": "tiny, its pause baseline (K = 3 pauses)",
            "410m_loop": "llama_config/410m, its loop baseline (K = 3)",
        },
        probe=(  # its modeling file, as the driver loads it (transformers <= 4.46.1, its pin)
            "import importlib.util as u; s = u.spec_from_file_location('m', sys.argv[1] + "
            "'/src/llamafactory/model/modeling/modeling_llama.py'); "
            "s.loader.exec_module(u.module_from_spec(s))"
        ),
        interop="t2mlr_jax.studies.ponderlm2_parity",
    ),
    "nanochat": Release(
        repo="karpathy/nanochat",
        driver="t2mlr_jax.studies.fixtures.karpathy_nanochat",
        sizes={"tiny": "tiny", "d12": "release default (d12)"},
        probe="from nanochat import checkpoint_manager, engine, gpt",
        interop="t2mlr_jax.studies.parity",
    ),
    "t2mlr": Release(
        repo="princeton-pli/T2MLR",
        driver="t2mlr_jax.studies.fixtures.t2mlr_release",
        sizes={"tiny": "tiny", "smollm135m": "SmolLM2-135M, (13,18), D 16, B 4"},
        # it imports with the driver's shims only, on transformers 4.56/4.57 only
        probe="from t2mlr_jax.studies.fixtures.t2mlr_release import check_transformers, release_classes; "
        "check_transformers(); release_classes(sys.argv[1])",
        interop="t2mlr_jax.studies.parity",
    ),
}


def parse_args(argv):
    parser = OneLineParser(prog=COMMAND, description=__doc__)
    parser.add_argument("--release", default="lrt", help=f"one of {', '.join(RELEASES)} (default lrt)")
    parser.add_argument("--release_src", required=True, help="a checkout of the release")
    parser.add_argument(
        "--release_python",
        default=sys.executable,
        help="a Python with torch and numpy (and, for lrt, filelock, tokenizers, rustbpe, tiktoken; for "
        "t2mlr, transformers 4.56/4.57) to run the release (default: this one)",
    )
    parser.add_argument(
        "--sizes",
        help="comma-separated (default the release's all: "
        + "; ".join(f"{name}: {','.join(release.sizes)}" for name, release in RELEASES.items())
        + ")",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("parity"), help="the folder to write (default parity/)"
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace an earlier run's OUT/SIZE/, parity.json and .md"
    )
    return parser.parse_args(argv)


def driver_of(release: Release):
    return importlib.import_module(release.driver)


def check_inputs(args) -> tuple[Release, list[str], dict]:
    """The release, the sizes and the release side's versions; a ValueError (one line) for bad input,
    before anything is written."""
    if args.release not in RELEASES:
        raise ValueError(f"--release {args.release}: unknown (known: {', '.join(RELEASES)})")
    release = RELEASES[args.release]
    args.sizes = args.sizes or ",".join(release.sizes)
    sizes = [size.strip() for size in args.sizes.split(",") if size.strip()]
    unknown = [size for size in sizes if size not in release.sizes]
    if unknown or not sizes:
        raise ValueError(
            f"--sizes {args.sizes}: unknown size {', '.join(unknown) or '(none given)'} "
            f"(--release {args.release} has {', '.join(release.sizes)})"
        )
    driver_of(release).check_release(args.release_src, args.release_python)
    if args.out.exists() and not args.out.is_dir():
        raise ValueError(f"--out {args.out} is not a folder")
    if args.out.is_dir() and any(args.out.iterdir()) and not args.overwrite:
        raise ValueError(
            f"--out {args.out} is not empty: pass --overwrite to replace an earlier run's results"
        )
    return release, list(dict.fromkeys(sizes)), probe_release(release, args)


def probe_release(release: Release, args) -> dict:
    """The release's Python imports torch and the release from the checkout: its versions and commit."""
    code = (
        "import json, platform, sys; sys.path.insert(0, sys.argv[1]); import numpy, torch; "
        f"{release.probe}; "
        "print(json.dumps({'torch': torch.__version__, 'numpy': numpy.__version__, "
        "'python': platform.python_version()}))"
    )
    src = str(Path(args.release_src).resolve())
    done = subprocess.run([args.release_python, "-c", code, src], capture_output=True, text=True, cwd=ROOT)
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ValueError(f"--release_python {args.release_python} cannot run the release from {src}: {last}")
    versions = json.loads(done.stdout.strip().splitlines()[-1])
    commit = subprocess.run(["git", "-C", src, "rev-parse", "HEAD"], capture_output=True, text=True)
    if commit.returncode:
        raise ValueError(f"--release_src {src} is not a git checkout (its commit is recorded)")
    return versions | {"commit": commit.stdout.strip()}


def run_driver(release: Release, args, log: Path, *driver_args) -> None:
    """The release's driver under --release_python, its output to `log`; a RuntimeError if it fails."""
    command = [
        args.release_python,
        "-m",
        driver_of(release).ENTRY_POINT,
        "--release_src",
        str(Path(args.release_src).resolve()),
        "--release_python",
        args.release_python,
        *map(str, driver_args),
    ]
    with open(log, "a") as out:
        out.write(f"$ {shlex.join(command)}\n")
        out.flush()
        done = subprocess.run(command, cwd=ROOT, env=os.environ, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode:
        tail = " | ".join(log.read_text().strip().splitlines()[-3:])
        raise RuntimeError(f"the release's driver failed (exit {done.returncode}; {log}): {tail}")


class Stages:
    """One progress line per stage, with its wall time."""

    def __init__(self, size: str):
        self.size, self.seconds = size, {}

    def run(self, name: str, what: str, fn, *fn_args):
        print(f"[{self.size}] {name}: {what} ...", end=" ", flush=True)
        start = time.perf_counter()
        try:
            result = fn(*fn_args)
        except BaseException:
            print("failed", flush=True)
            raise
        self.seconds[name] = round(time.perf_counter() - start, 1)
        print(f"{self.seconds[name]:.1f} s", flush=True)
        return result


def reload_figures(folder: Path, state: dict) -> dict:
    """Step 4's figures: the release's logits on our export against those on its own checkpoint."""
    import numpy as np

    with np.load(folder / "release" / "release.npz") as theirs, np.load(folder / "export_logits.npz") as back:
        own, exported = theirs["logits"], back["logits"]
    same_shape = own.shape == exported.shape
    trip = {
        "state": state,
        "logits_bitwise_equal": bool(same_shape and np.array_equal(own, exported)),
        "logits_max_abs_diff": float(np.abs(own.astype(np.float64) - exported).max()) if same_shape else None,
    }
    trip["passed"] = state["bitwise"] and state["padded_rows_zero"] and trip["logits_bitwise_equal"]
    return trip


def check_size(release: Release, args, size: str) -> dict:
    """Every figure of one size (module docstring, steps 1-4)."""
    import numpy as np

    folder = args.out / size
    if folder.exists():  # --overwrite: an earlier run's
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    stages = Stages(size)
    log, npz = folder / "release.log", folder / "release" / "release.npz"
    built = "the release builds, saves and runs its model"
    stages.run("release", built, run_driver, release, args, log, "--size", size, "--out", folder / "release")
    prefill = driver_of(release).SIZES[size].prefill
    interop = importlib.import_module(release.interop)
    ours = "import it; our logits, loss, gradients and cached decode"
    cfg, params, figures = stages.run("ours", ours, interop.our_side, folder, prefill)
    exported = "write ours back in the release's format"
    state, num_params = stages.run("export", exported, interop.export_side, folder, cfg, params)
    del params
    reloaded = "the release loads our export and runs it"
    driver_args = ("--logits_of", folder / "export", "--tokens_from", npz, "--out", folder)
    stages.run("reload", reloaded, run_driver, release, args, log, *driver_args)
    figures["round_trip"] = reload_figures(folder, state)
    figures["passed"] = figures["passed"] and figures["round_trip"]["passed"]
    with np.load(npz) as theirs:
        tokens = list(theirs["tokens"].shape)
    return {
        "label": release.sizes[size],
        "model_config": interop.release_config(folder),
        "params": int(num_params),
        "tokens": tokens,
        "prefill": prefill,
        **figures,
        "seconds": stages.seconds,
    }


def count(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}K"


def round_trip_cell(trip: dict) -> str:
    state = trip["state"]
    rows = (
        f", padded rows {state['padded_rows']} x {len(state['padded_tables'])} tables 0 in ours"
        if state["padded_tables"]
        else ""
    )
    return (
        f"state {'yes' if state['bitwise'] else 'NO'}{rows}; "
        f"release logits on export {'yes' if trip['logits_bitwise_equal'] else 'NO'}"
    )


def grad_cell(size: dict) -> str:
    """The gradients' cell (a recurrent model's: of its interleaved training step); — without them."""
    grads = size.get("gradients")
    if grads is None:
        return "—"
    return f"{grads['max_relative_diff']:.2e}" + ("" if grads["passed"] else " (FAIL)")


def figure_cell(section: dict) -> str:
    """max |Δ| and its ratio to max |logit|, FAIL when out of tolerance."""
    return f"{section['max_abs_diff']:.2e} (rel {section['relative']:.1e})" + (
        "" if section["passed"] else " (FAIL)"
    )


def logits_cell(size: dict) -> str:
    """The logits' cell: the inference forward's, and the training forward's where it is another one."""
    train = size.get("train_logits")
    return figure_cell(size["logits"]) + (f"; train {figure_cell(train)}" if train else "")


def worst_ratio(size: dict) -> float:
    """The size's largest error / bound over its figures (the headroom left: 1 is the bound)."""
    return max(
        section["ratio"] for section in size.values() if isinstance(section, dict) and "ratio" in section
    )


def markdown(report: dict) -> str:
    lines = [
        "| release | size | params | max\\|Δlogits\\| | max rel Δgrad | decode max\\|Δ\\| "
        "| worst error / bound | round trip bitwise | pass |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for size in report["sizes"].values():
        lines.append(
            f"| {report['release']} | {size['label']} | {count(size['params'])} "
            f"| {logits_cell(size)} "
            f"| {grad_cell(size)} "
            f"| {figure_cell(size['decode'])} "
            f"| {worst_ratio(size):.2f} "
            f"| {round_trip_cell(size['round_trip'])} | {'yes' if size['passed'] else 'NO'} |"
        )
    return "\n".join(lines) + "\n"


def notes(report: dict) -> str:
    lines = [
        f"\nRelease {report['release_repo']} at {report['release_commit'][:7]}; "
        f"torch {report['versions']['torch']} (release side), jax {report['versions']['jax']}; "
        f"fp32 on the CPU (XLA_FLAGS {os.environ.get('XLA_FLAGS', '') or 'unset'}). Bounds, derived from "
        "each path's depth (t2mlr_jax.studies.parity): logits "
        f"{report['tolerances']['logits']}; gradients {report['tolerances']['gradients']}.",
    ]
    for name, size in report["sizes"].items():
        zero = size["gradients"]["zero_keys"]
        if "kv_refresh" in size:  # the recurrent GPT: its sequential logits are its decode
            train = size["train_logits"]
            what = (
                "the release's sequential inference against our exact recurrence (logits) and our cached "
                f"decode; its interleaved training step ({train['passes']} passes) against our "
                f"lrt.training=interleaved: passes' logits max rel Δ {train['relative']:.1e}; "
                f"with the KV refresh: logits max rel Δ {size['kv_refresh']['relative']:.1e}, "
                f"|Δ loss| {size['kv_refresh']['loss_abs_diff']:.2e}"
            )
        else:
            what = (
                "the release's own cached decode vs its forward: max |Δ| "
                f"{size['decode']['release_decode_vs_forward']:.2e}"
            )
        bounds = ", ".join(
            f"{key} {section['tolerance']:.1e} ({section['layers']} layers, ratio {section['ratio']:.2f})"
            for key, section in size.items()
            if isinstance(section, dict) and "layers" in section
        )
        lines.append(
            f"- {name}: relative bounds {bounds}; |Δ loss| {size['loss']['abs_diff']:.2e} "
            f"(bound {size['loss']['tolerance']:.1e}); {what}; "
            f"worst gradient {size['gradients']['worst_key']}"
            + (f"; {len(zero)} all-zero release gradients, max |Δ| {max(zero.values()):.2e}" if zero else "")
            + "; wall time "
            + ", ".join(f"{stage} {seconds:.1f} s" for stage, seconds in size["seconds"].items())
        )
    return "\n".join(lines) + "\n"


def run(args, release: Release, sizes: list[str], versions: dict) -> int:
    import jax
    import numpy as np

    from t2mlr_jax.studies.parity import TOLERANCES

    args.out.mkdir(parents=True, exist_ok=True)
    for name in ("parity.json", "parity.md"):
        (args.out / name).unlink(missing_ok=True)
    start = time.perf_counter()
    report = {
        "release": args.release,
        "release_repo": release.repo,
        "release_commit": versions["commit"],
        "release_src": str(Path(args.release_src).resolve()),
        "command": f"{COMMAND} {shlex.join(sys.argv[1:])}",
        "versions": {
            "torch": versions["torch"],
            "release_numpy": versions["numpy"],
            "release_python": versions["python"],
            "jax": jax.__version__,
            "numpy": np.__version__,
        },
        "dtype": "float32",
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "tolerances": TOLERANCES,
        "sizes": {},
    }
    for size in sizes:
        report["sizes"][size] = check_size(release, args, size)
    report["passed"] = all(size["passed"] for size in report["sizes"].values())
    report["seconds"] = round(time.perf_counter() - start, 1)
    (args.out / "parity.json").write_text(json.dumps(report, indent=2) + "\n")
    table = markdown(report)
    (args.out / "parity.md").write_text(table + notes(report))
    print("\n" + table, end="")
    print(f"wrote {args.out}/parity.json and {args.out}/parity.md ({report['seconds']:.0f} s)")
    return 0 if report["passed"] else 1


def main(argv=None) -> int:
    from t2mlr_jax.formats.files import one_line

    args = parse_args(argv)
    try:
        checked = check_inputs(args)
    except ValueError as e:  # bad input: nothing written
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    try:
        return run(args, *checked)
    except (RuntimeError, ValueError, OSError) as e:  # the release failed to run, or ours refused its model
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    cpu_runtime.tune()
    sys.exit(main())
