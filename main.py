"""Train, evaluate or sample T²MLR and its baselines from an ml_collections config file.

  python main.py --seeds=0,1,2 --workers=2    # the demo (make demo): T²MLR vs a parameter-matched transformer
  python main.py --config=configs/s5_retrieval_t2mlr.py:cpu --workdir=runs/s5
  python main.py --config=configs/smollm135m_t2mlr.py:baseline,cpu --config.train.steps=50 --workdir=runs/b
  python main.py --config=configs/s5_retrieval_t2mlr.py:cpu --workdir=runs/s5 --mode=eval
  python main.py --config=configs/variable_assignment.py:cpu --workdir=runs/va --mode=generate
  python main.py --config=configs/smollm2_retrofit.py:cpu --mode=eval --workdir=runs/base   # the pretrained
      model of config.init_from (a .gguf, HF or T²MLR folder, or a training workdir), nothing trained
  python main.py --config=configs/recirculation.py:cpu --workdir=runs/recirc   # training-free: the sweep

A config's `arch` may list several architectures ("t2mlr,transformer"): each trains into workdir/<arch>
and the workdir gets a comparison (summary.json, accuracy_vs_length.png). Training resumes from the
workdir's latest checkpoint; SIGTERM/SIGINT save and stop (exit status 75: rerun to resume); one
session trains a workdir at a time (workdir/train.lock). eval / generate read the workdir's latest
checkpoint, or config.init_from's weights when the workdir has none (only the eval data is needed then);
text is scored in non-overlapping windows of eval.window tokens (0 = data.seq_len).
Results: metrics.jsonl, tensorboard/, summary.json (train), eval_step<N>.json (eval; N = 0 for an
untrained init_from model), generations.jsonl (generate). `python tools/report.py WORKDIR` summarises a run.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import sys
import time
from pathlib import Path

from absl import app, flags, logging

from t2mlr_jax.config.cli import config_file_flag, fail
from t2mlr_jax.train.local_workers import parse_shard, shard_of

DEMO_CONFIG = str(Path(__file__).resolve().parent / "configs" / "s5_retrieval_t2mlr.py") + ":demo"

_CONFIG = config_file_flag(
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
_SEEDS = flags.DEFINE_list(
    "seeds",
    [],
    "Comma list of seeds: every architecture trains (evaluates, samples) once per seed, into "
    "workdir/<arch>/seed<S>, and the comparison reports each seed and their spread. Default: config.seed.",
)
_WORKERS = flags.DEFINE_integer(
    "workers",
    1,
    "Train the runs (architectures x seeds) in this many local processes side by side, each this command "
    "with --shard=I/N (its output in workdir/worker<I>.log), then compare them. On 2 CPU cores, 2 workers "
    "finish `make demo` ~1.7x sooner (measured: 2 min 21 s against 4 min 2 s).",
)
_SHARD = flags.DEFINE_string(
    "shard", None, "I/N: train only every N-th run from the I-th and compare nothing (what --workers runs)."
)

RESUMABLE = 75  # exit status of a run stopped by SIGTERM / SIGINT after saving (sysexits' EX_TEMPFAIL)


def _parse_flags(argv: list[str]) -> list[str]:
    from t2mlr_jax.config.cli import parse_flags

    return parse_flags(argv, _CONFIG, DEMO_CONFIG)


def _flag_value(argv: list[str], name: str) -> str | None:
    """The last value of --name=V or --name V in `argv`, read before absl parses it."""
    value = None
    for i, arg in enumerate(argv):
        if arg.startswith(f"--{name}="):
            value = arg.split("=", 1)[1]
        elif arg == f"--{name}" and i + 1 < len(argv):
            value = argv[i + 1]
    return value


def _helping(argv: list[str]) -> bool:
    return any(arg.startswith(("-h", "-?", "--help")) for arg in argv[1:])


def _name_the_architectures() -> None:
    """--help lists every registered architecture: the research systems found in t2mlr_jax/architectures/
    and those T2MLR_JAX_SYSTEMS names."""
    global __doc__
    try:
        from t2mlr_jax.architectures import ARCHITECTURES
    except ValueError as e:  # a T2MLR_JAX_SYSTEMS module that is not there
        fail(e)
    __doc__ += f"Architectures (config.arch): {', '.join(ARCHITECTURES.names())}.\n"


def _named_workdir_lock(argv: list[str]):
    """The --workdir the command line names, locked before anything heavy is imported: a second writer is
    refused in a fraction of a second, having read and written nothing. main() locks it again (re-entrant)
    with every other folder it writes. Not for --help, a --shard worker (its parent holds the workdir) or
    one process of a multi-process launch (whether it is the lead, the one that locks, takes JAX to tell)."""
    from t2mlr_jax.parallel.launch import several_processes
    from t2mlr_jax.storage.workdir_lock import WorkdirLockedError, WorkdirUnwritableError, workdir_lock

    workdir = _flag_value(argv, "workdir")
    held = contextlib.ExitStack()
    if workdir and not _helping(argv) and not _flag_value(argv, "shard") and not several_processes():
        try:
            held.enter_context(workdir_lock(workdir))
        except (WorkdirLockedError, WorkdirUnwritableError) as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
    return held


def _seeds() -> list[int]:
    try:
        seeds = [int(s) for s in _SEEDS.value]
    except ValueError:
        raise ValueError(f"--seeds takes a comma list of integers, got {','.join(_SEEDS.value)!r}") from None
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds lists a seed twice: {seeds}")
    return seeds


def _check_workers(mode: str, several_processes: bool) -> None:
    if _WORKERS.value < 1:
        raise ValueError(f"--workers must be at least 1, got {_WORKERS.value}")
    if (_WORKERS.value > 1 or _SHARD.value) and mode != "train":
        raise ValueError(f"--workers and --shard are for --mode=train, not --mode={mode}")
    if _SHARD.value:
        parse_shard(_SHARD.value)
    if _WORKERS.value > 1 and several_processes:
        raise ValueError("--workers starts local processes; a multi-host launch already runs one per host")


def _training_free(config):
    """What --mode=train runs for an architecture with nothing to train (its registered study: recirculation's
    sweep), or None."""
    from t2mlr_jax.architectures import arch_names

    names = arch_names(config)
    if len(names) != 1:
        return None
    from t2mlr_jax.studies.training_free import STUDIES

    return STUDIES.get(names[0]) if names[0] in STUDIES else None


def _plan(config, workdir: Path, seeds: list[int]) -> dict:
    """run -> (architecture, its config, its workdir): one per architecture, or per architecture and seed.
    Each of a comma list's architectures trains the train.flop_budget steps it affords (`for_arch`; resolve
    sets a single architecture's)."""
    from t2mlr_jax.architectures import arch_names
    from t2mlr_jax.experiment import for_arch

    names = arch_names(config)
    configs = {name: for_arch(config, name) if len(names) > 1 else config for name in names}
    if seeds:
        return {
            f"{name}/seed{s}": (name, configs[name].replace(seed=s), workdir / name / f"seed{s}")
            for name in names
            for s in seeds
        }
    return {name: (name, configs[name], workdir / name if len(names) > 1 else workdir) for name in names}


def _worker_count(runs: int) -> int:
    """The processes --workers trains `runs` runs in (1: this one)."""
    return 1 if _SHARD.value else min(_WORKERS.value, runs)


def _written_folders(plan: dict, workdir: Path, mode: str) -> list[Path]:
    """The folders this command writes, each locked before anything is read or built: the comparison's
    workdir, then every run this process trains, evaluates or samples (a --workers parent's workers lock
    their own)."""
    shard = parse_shard(_SHARD.value) if _SHARD.value else None
    comparison = [workdir] if len(plan) > 1 and not shard else []
    if mode == "train" and _worker_count(len(plan)) > 1:
        return comparison
    return comparison + [plan[key][2] for key in shard_of(list(plan), shard)]


def _setup(config, plan: dict, mode: str):
    """Build and check every run before anything is compiled: one clear error on bad input. eval and
    generate need only the eval data."""
    from t2mlr_jax.train.build_data import build_data_source
    from t2mlr_jax.train.data_source import check_prompts_fit
    from t2mlr_jax.train.init_from import require_init_from
    from t2mlr_jax.train.trainer import Run, check_loadable

    if mode == "train":
        require_init_from(config)
    if mode == "eval" and config.eval.lm_eval_tasks:
        _benchmarks(config)  # unknown task names fail here, before anything is loaded or compiled
    if mode != "train":
        for _, run_config, path in plan.values():
            check_loadable(path, run_config)
    sources = {  # the data order follows the seed
        s: build_data_source(config.replace(seed=s), train=mode == "train")
        for s in dict.fromkeys(c.seed for _, c, _ in plan.values())
    }
    runs = {key: Run(c, path, sources[c.seed], name) for key, (name, c, path) in plan.items()}
    data = next(iter(sources.values()))
    if mode == "generate" and data.generation_examples is not None:  # eval.generate off: not checked yet
        examples = list(itertools.islice(data.generation_examples(), _NUM_GENERATE.value))
        for run in runs.values():
            check_prompts_fit(examples, config.eval.max_new_tokens, run.arch.max_seq_len)
    return runs


def _train(config, workdir: Path, runs: dict) -> None:
    import jax

    from t2mlr_jax.analysis.compare import write_comparison
    from t2mlr_jax.storage.workdir import SUMMARY
    from t2mlr_jax.train.trainer import train

    started = time.time()
    summaries = {}
    shard = parse_shard(_SHARD.value) if _SHARD.value else None
    if _worker_count(len(runs)) > 1:
        _train_in_workers(workdir, runs)
        summaries = {name: json.loads((run.workdir / SUMMARY).read_text()) for name, run in runs.items()}
    for name in shard_of(list(runs), shard) if not summaries else ():
        run = runs[name]
        print(
            f"training {name} ({run.num_params} parameters) in {run.workdir} on {run.mesh.size} devices "
            f"({jax.process_count()} hosts)"
            + (f", {run.flops_per_step:.3g} FLOPs per step" if run.flops_per_step else ""),
            flush=True,
        )
        summaries[name] = train(run)
        if "stopped_by" in summaries[name]:
            stopped = summaries[name]
            print(
                f"{name}: stopped by {stopped['stopped_by']} at step {stopped['step']}, resumable: rerun the "
                "same command to continue",
                flush=True,
            )
            sys.exit(RESUMABLE)
    for name, summary in summaries.items():
        print(f"{name}: {summary['num_params']} params, {_metrics_line(summary['eval'], config)}")
    if len(runs) > 1 and not shard:
        d = config.data.options
        trained = f"N {d['min_actions']}..{d['max_actions']}" if "max_actions" in d else ""
        archs = ", ".join(dict.fromkeys(run.arch.name for run in runs.values()))
        seeds = f" (seeds {', '.join(_SEEDS.value)})" if _SEEDS.value else ""
        result = write_comparison(
            workdir, summaries, title=f"{config.name}: {archs}{seeds}", train_lengths=trained
        )
        for arch, row in result["runs"].items():
            for metric, spread in row.get("spread", {}).items():
                if metric != "loss":
                    print(
                        f"{arch} {metric} over seeds {', '.join(row['seeds'])}: {spread['mean']:.3f} ± "
                        f"{spread['std']:.3f} (std; range {spread['min']:.3f} to {spread['max']:.3f})"
                    )
        print(
            f"comparison ({time.time() - started:.0f} s): {workdir / 'summary.json'}, "
            f"{workdir / 'accuracy_vs_length.png'}"
        )


def _train_in_workers(workdir: Path, runs: dict) -> None:
    """--workers: the runs trained by shards of this command side by side; exits RESUMABLE when a signal
    stopped them."""
    count = _worker_count(len(runs))
    print(
        f"training {len(runs)} runs in {count} processes (their output: {workdir}/worker<I>.log)", flush=True
    )
    command = [sys.executable, str(Path(__file__).resolve()), *sys.argv[1:]]
    commands = [[*command, f"--shard={i}/{count}"] for i in range(count)]
    workdir.mkdir(parents=True, exist_ok=True)
    from t2mlr_jax.train.local_workers import run_workers

    if not run_workers(commands, workdir, [run.workdir for run in runs.values()]):
        print("stopped by a signal, resumable: rerun the same command to continue", flush=True)
        sys.exit(RESUMABLE)


def _metrics_line(metrics: dict, config) -> str:
    """The metrics that fit the data: loss / perplexity / bits per byte for text, accuracies for tasks."""
    shown = {"loss": "loss", "perplexity": "perplexity", "bpb": "bits per byte"}
    if config.data.kind != "text":
        shown = {
            "loss": "loss",
            "token_accuracy": "token accuracy",
            "exact_match": "exact match",
            "generation_exact_match": "generation exact match",
            "bpb": "bits per byte",
        }
    return ", ".join(f"{label} {metrics[key]:.4g}" for key, label in shown.items() if key in metrics)


def _benchmarks(config):
    """(task names, their lm-eval task index) of config.eval.lm_eval_tasks."""
    if not config.data.tokenizer:
        raise ValueError("eval.lm_eval_tasks needs the model's text tokenizer: set data.tokenizer")
    if config.eval.lm_eval_prefix_token_id is not None:  # an id outside the vocabulary fails here
        from t2mlr_jax.data.tokenizer import load_tokenizer
        from t2mlr_jax.train.lm_eval_bridge import empty_context_token

        empty_context_token(load_tokenizer(config.data.tokenizer), config.eval.lm_eval_prefix_token_id)
    return _task_index(config.eval.lm_eval_tasks, config.eval.lm_eval_include_path)


@functools.cache
def _task_index(names: str, include_path: str):
    from t2mlr_jax.train.lm_eval_bridge import tasks_manager

    tasks = [t.strip() for t in names.split(",") if t.strip()]
    return tasks, tasks_manager(tasks, include_path or None)


def _evaluate(runs: dict, config) -> None:
    from t2mlr_jax.parallel.multihost import is_lead_host
    from t2mlr_jax.storage.workdir import write_atomic
    from t2mlr_jax.train.trainer import restore_state, run_eval

    for name, run in runs.items():
        state, step = restore_state(run)
        metrics = run_eval(run, state.params, state.model_state)
        windows = ""
        if config.data.kind == "text":  # non-overlapping windows of eval.window tokens
            metrics["window"] = config.eval.window or config.data.seq_len
            windows = f" over {metrics['examples']} windows of {metrics['window']} tokens"
        if config.eval.lm_eval_tasks:
            metrics["lm_eval"] = _lm_eval(run, state, config)
        path = run.workdir / f"eval_step{step}.json"
        if is_lead_host():
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, json.dumps(metrics, indent=2, default=str))
        print(f"{name} @ {_source(run, step)}: {_metrics_line(metrics, config)}{windows} -> {path}")


def _lm_eval(run, state, config) -> dict:
    """lm-evaluation-harness's metrics per task (config.eval.lm_eval_*), printed as its table."""
    from lm_eval.utils import make_table

    from t2mlr_jax.data.tokenizer import load_tokenizer
    from t2mlr_jax.train.lm_eval_bridge import ModelBundle, run_tasks

    tasks, manager = _benchmarks(config)
    e = config.eval
    bundle = ModelBundle(run.arch, state.params, state.model_state, load_tokenizer(config.data.tokenizer))
    results = run_tasks(
        bundle,
        tasks,
        limit=e.lm_eval_limit or None,
        num_fewshot=e.lm_eval_fewshot,
        batch_size=e.batch_size,
        manager=manager,
        prefix_token_id=e.lm_eval_prefix_token_id,
    )
    print(make_table(results))
    return results["results"]


def _generate(runs: dict, count: int) -> None:
    from t2mlr_jax.train.dump_generations import write_generations
    from t2mlr_jax.train.trainer import restore_state

    for name, run in runs.items():
        state, step = restore_state(run)
        run.workdir.mkdir(parents=True, exist_ok=True)
        path = write_generations(run, state.params, state.model_state, count)
        print(f"{name} @ {_source(run, step)}: {count} examples -> {path}")


def _source(run, step: int) -> str:
    return f"step {step}" if step else f"init_from {run.config.init_from}"


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from t2mlr_jax.experiment import resolve
    from t2mlr_jax.parallel.multihost import initialize_distributed, is_lead_host
    from t2mlr_jax.storage.checkpoint import AllCorruptError
    from t2mlr_jax.storage.full_disk import NoSpaceError
    from t2mlr_jax.storage.workdir_lock import WorkdirLockedError, WorkdirUnwritableError, workdir_lock
    from t2mlr_jax.train import startup
    from t2mlr_jax.train.compilation_cache import enable_compilation_cache
    from t2mlr_jax.train.local_workers import WorkerFailed
    from t2mlr_jax.train.stopping import NonFiniteError
    from t2mlr_jax.train.trainer import NoCheckpointError

    startup.mark("imports")
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # orbax and grain log every file at INFO
    try:
        config = resolve(_CONFIG.value)  # typed from here on: every field checked before anything is built
    except (ValueError, KeyError) as e:
        fail(e)
    workdir = Path(_WORKDIR.value or Path("workdir") / config.name)
    with contextlib.ExitStack() as locks:
        try:
            several = initialize_distributed()  # multi-process launches (TPU pod, SLURM, explicit)
            lead = is_lead_host() if several else True
            training_free = _training_free(config) if _MODE.value == "train" else None
            _check_workers(_MODE.value, several)
            plan = _plan(config, workdir, _seeds())
            # every folder this command writes is locked before anything else: a refused command changes
            # nothing, prints nothing else, and is refused at once
            for folder in [workdir] if training_free else _written_folders(plan, workdir, _MODE.value):
                locks.enter_context(workdir_lock(folder, lead=lead))
            enable_compilation_cache(config.compilation_cache)
            if training_free is not None:
                print(f"{config.arch} has nothing to train: running its sweep into {workdir}", flush=True)
                training_free(config, workdir)
                return
            runs = _setup(config, plan, _MODE.value)
            startup.mark("config")
        except (ValueError, KeyError, FileNotFoundError, WorkdirLockedError, WorkdirUnwritableError) as e:
            fail(e)
        try:
            {
                "train": lambda: _train(config, workdir, runs),
                "eval": lambda: _evaluate(runs, config),
                "generate": lambda: _generate(runs, _NUM_GENERATE.value),
            }[_MODE.value]()
        except (NoCheckpointError, WorkdirLockedError, AllCorruptError) as e:
            fail(e)
        except WorkerFailed as e:
            fail(e, status=1)
        except (NonFiniteError, NoSpaceError) as e:  # not bad input: the run diverged, or the disk is full
            fail(e, status=1)


if __name__ == "__main__":
    with _named_workdir_lock(sys.argv):
        from t2mlr_jax import cpu_runtime

        cpu_runtime.tune()  # before JAX starts its backend, which reads XLA_FLAGS
        if _helping(sys.argv):
            _name_the_architectures()
        app.run(main, flags_parser=_parse_flags)
