"""Train, evaluate or sample T²MLR and its baselines from an ml_collections config file.

  python main.py                              # the demo: T²MLR vs a parameter-matched transformer, CPU-sized
  python main.py --config=configs/s5_retrieval_t2mlr.py:cpu --workdir=runs/s5
  python main.py --config=configs/smollm135m_t2mlr.py:baseline,cpu --config.train.steps=50 --workdir=runs/b
  python main.py --config=configs/s5_retrieval_t2mlr.py:cpu --workdir=runs/s5 --mode=eval
  python main.py --config=configs/variable_assignment.py:cpu --workdir=runs/va --mode=generate

A config's `arch` may list several architectures ("t2mlr,transformer"): each trains into workdir/<arch>
and the workdir gets a comparison (summary.json, accuracy_vs_length.png). Training resumes from the
workdir's latest checkpoint; SIGTERM/SIGINT save and stop. Results: metrics.jsonl, tensorboard/,
summary.json (train), eval_step<N>.json (eval), generations.jsonl (generate).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from absl import app, flags, logging
from ml_collections import config_flags

DEMO_CONFIG = str(Path(__file__).resolve().parent / "configs" / "s5_retrieval_t2mlr.py") + ":demo"

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    DEMO_CONFIG,
    "Experiment config file (configs/*.py), optionally with ':preset[,preset]'. "
    "Fields can be overridden with --config.<section>.<field>=value. Default: the CPU demo.",
)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Run directory (checkpoints, logs, results). Default: workdir/<config.name>."
)
_MODE = flags.DEFINE_enum(
    "mode",
    "train",
    ["train", "eval", "generate"],
    "train (resumes if the workdir has checkpoints), eval (latest checkpoint) or "
    "generate (greedy outputs for the first eval examples).",
)
_NUM_GENERATE = flags.DEFINE_integer("num_generate", 16, "Examples to decode in --mode=generate.")


def _setup(config, workdir: Path):
    """Build and check every run before anything is compiled: one clear error on bad input."""
    from t2mlr_jax.architectures import arch_names
    from t2mlr_jax.train.build_data import build_data_source
    from t2mlr_jax.train.trainer import Run

    names = arch_names(config)
    data = build_data_source(config)
    return {name: Run(config, workdir / name if len(names) > 1 else workdir, data, name) for name in names}


def _train(config, workdir: Path, runs: dict) -> None:
    import jax

    from t2mlr_jax.train.compare import write_comparison
    from t2mlr_jax.train.trainer import train

    started = time.time()
    summaries = {}
    for name, run in runs.items():
        print(
            f"training {name} ({run.num_params} parameters) in {run.workdir} on {run.mesh.size} devices "
            f"({jax.process_count()} hosts)"
            + (f", {run.flops_per_step:.3g} FLOPs per step" if run.flops_per_step else ""),
            flush=True,
        )
        summaries[name] = train(run)
        if "stopped_by" in summaries[name]:
            return
        ev = summaries[name]["eval"]
        print(
            f"{name}: {run.num_params} params, loss {ev['loss']:.4f}, token accuracy "
            f"{ev['token_accuracy']:.3f}, exact match {ev['exact_match']:.3f}"
            + (f", bits per byte {ev['bpb']:.4f}" if "bpb" in ev else "")
        )
    if len(runs) > 1:
        d = config.data.options.to_dict()
        trained = f"N {d['min_actions']}..{d['max_actions']}" if "max_actions" in d else ""
        write_comparison(workdir, summaries, title=f"{config.name}: {', '.join(runs)}", train_lengths=trained)
        print(
            f"comparison ({time.time() - started:.0f} s): {workdir / 'summary.json'}, "
            f"{workdir / 'accuracy_vs_length.png'}"
        )


def _evaluate(runs: dict) -> None:
    from t2mlr_jax.parallel.multihost import is_lead_host
    from t2mlr_jax.train.trainer import restore_state, run_eval

    for name, run in runs.items():
        state, step = restore_state(run)
        metrics = run_eval(run, state.params, state.model_state)
        path = run.workdir / f"eval_step{step}.json"
        if is_lead_host():
            path.write_text(json.dumps(metrics, indent=2, default=str))
        print(
            f"{name} @ step {step}: loss {metrics['loss']:.4f}, exact match {metrics['exact_match']:.3f}"
            + (f", bits per byte {metrics['bpb']:.4f}" if "bpb" in metrics else "")
            + f" -> {path}"
        )


def _generate(runs: dict, count: int) -> None:
    from t2mlr_jax.train.dump_generations import write_generations
    from t2mlr_jax.train.trainer import restore_state

    for name, run in runs.items():
        state, step = restore_state(run)
        path = write_generations(run, state.params, state.model_state, count)
        print(f"{name} @ step {step}: {count} examples -> {path}")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from t2mlr_jax.parallel.multihost import initialize_distributed
    from t2mlr_jax.train.trainer import NoCheckpointError

    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # orbax and grain log every file at INFO
    config = _CONFIG.value
    workdir = Path(_WORKDIR.value or Path("workdir") / config.name)
    try:
        initialize_distributed()  # multi-process launches (TPU pod, SLURM, explicit); nothing on one host
        runs = _setup(config, workdir)
    except (ValueError, KeyError, FileNotFoundError) as e:
        _fail(e)
    try:
        {
            "train": lambda: _train(config, workdir, runs),
            "eval": lambda: _evaluate(runs),
            "generate": lambda: _generate(runs, _NUM_GENERATE.value),
        }[_MODE.value]()
    except NoCheckpointError as e:
        _fail(e)


def _fail(error: Exception) -> None:
    """Bad input: one line on stderr, exit status 2, no traceback."""
    print(f"error: {error}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    app.run(main)
