"""The training loop: validate everything, restore or initialise, train with periodic logging, evaluation
and checkpoints, stop cleanly on SIGTERM/SIGINT (saving first), and write a summary.

Order matters: every check that can fail (config, data, vocabulary, context length, a workdir of another
run, a checkpoint whose optimizer state no longer fits) runs before the first compilation and before any
checkpoint is written or read; the workdir is written to only once the starting state exists.

Nothing silent: a step whose loss or gradient norm is not finite is never applied
(the train step keeps the previous state) and, under train.nan_policy "stop", ends the run with
NonFiniteError before anything of it is saved; under "skip" it is logged and skipped, up to
train.nan_skip_limit times.
"""

from __future__ import annotations

import json
import logging
import math
import signal
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
import tqdm

from t2mlr_jax.architectures import ARCHITECTURES, Architecture, build_architecture, flops_per_step
from t2mlr_jax.architectures.contract import pretrained_path
from t2mlr_jax.config.convert import model_to_dict, to_dict
from t2mlr_jax.config.sections import Experiment
from t2mlr_jax.cpu_runtime import once_options
from t2mlr_jax.parallel.mesh import check_batch, check_experts, make_mesh
from t2mlr_jax.parallel.multihost import global_batch, is_lead_host
from t2mlr_jax.parallel.placement import place
from t2mlr_jax.storage import checkpoint as ckpt
from t2mlr_jax.storage import full_disk, run_config
from t2mlr_jax.storage.workdir import (
    CHECKPOINTS,
    CORRUPT,
    METRICS,
    PROFILE,
    SUMMARY,
    check_checkpoints,
    log_session,
    move_aside,
    saved_steps,
    write_atomic,
)
from t2mlr_jax.storage.workdir_lock import workdir_lock
from t2mlr_jax.train import init_from, startup
from t2mlr_jax.train.compilation_cache import compile_in_process, in_process
from t2mlr_jax.train.data_source import DataSource, check_fits, check_generation
from t2mlr_jax.train.eval import evaluate, evaluate_generation, make_eval_step, sampling_settings
from t2mlr_jax.train.metrics_log import MetricsLog, json_safe
from t2mlr_jax.train.optimizer import OPTIMIZERS
from t2mlr_jax.train.profiling import ProfileWindow
from t2mlr_jax.train.programs import Programs
from t2mlr_jax.train.stopping import NonFiniteError, non_finite, out_of_space, stop_on_signals
from t2mlr_jax.train.train_step import TrainState, model_inputs


class Run:
    """Everything a mode needs, built and checked without compiling: architecture, data, optimizer,
    checkpointer. `restore_or_init` gives the state to start from."""

    def __init__(self, config: Experiment, workdir: Path, data: DataSource, arch_name: str):
        self.config, self.workdir, self.data = config, Path(workdir), data
        if config.train.epochs:
            self.config = config = _steps_for_epochs(config, data.train_examples)
        OPTIMIZERS.get(config.optimizer.name)  # an unknown optimizer: one error before anything is built
        self.arch: Architecture = build_architecture(config, arch_name)
        # config.init_from (a finetuning config requires one) and its checkpoint, checked now; its weights
        # are read only when a fresh state is made
        self.start_weights = init_from.start_weights(config, self.arch)
        self.flops_per_step = flops_per_step(config, self.arch)  # train.flop_budget's steps: set by resolve
        check_fits(data, vocab_size=config.model.vocab_size, max_seq_len=self.arch.max_seq_len)
        check_generation(data, config.eval, max_seq_len=self.arch.max_seq_len)
        self.settings = to_dict(config)
        self.identity = {
            **run_config.run_identity(self.settings),
            "arch": arch_name,
            **_section_identity(self.settings, arch_name),
        }
        self.mesh = make_mesh(**config.mesh.sizes())
        check_batch(config.train.batch_size, self.mesh, config.train.grad_accum)
        if self.arch.backbone is not None and self.arch.backbone.routed_experts:
            check_experts(self.arch.backbone.routed_experts, self.mesh)
        check_checkpoints(self.workdir / CHECKPOINTS)
        run_config.check_workdir(self.workdir, self.identity)
        self.changes = run_config.changed_settings(self.workdir, self.settings)
        self.programs = Programs(config, self.arch, self.mesh)
        self.schedule, self.optimizer = self.programs.schedule, self.programs.optimizer
        self.num_params = self.arch.num_params()
        self.reset_optimizer = ckpt.check_resumable(
            self.workdir / CHECKPOINTS,
            self.programs.state_shapes,
            reset_optimizer=config.train.reset_optimizer,
            changes=self.changes,
        )
        self.state_shardings = self.programs.state_shardings

    def checkpointer(self) -> ckpt.Checkpointer:
        t = self.config.train
        return ckpt.Checkpointer(
            self.workdir / CHECKPOINTS,
            save_every=t.checkpoint_every,
            keep=t.keep_checkpoints,
            async_save=t.async_checkpoint,
            about={  # what t2mlr_jax.interop.orbax_folder needs to read a step folder as a model
                "arch": self.identity["arch"],
                "model_config": self.arch.backbone and model_to_dict(self.arch.backbone),
                "tokenizer": self.config.data.tokenizer,
            },
        )

    def abstract_state(self) -> TrainState:
        """The state's shapes with this run's shardings: restoring onto them reshards a checkpoint
        saved on any other mesh."""
        return self.programs.abstract_state()

    def abstract_batch(self) -> dict[str, jax.ShapeDtypeStruct]:
        """A global training batch's shapes (train.batch_size x data.seq_len) and sharding: the step is
        compiled from these before the input pipeline starts."""
        t, seq_len = self.config.train, self.config.data.seq_len
        return self.programs.abstract_batch(t.batch_size, seq_len, self.data.target_bytes)

    def fresh_state(self) -> TrainState:
        """A new state, initialised in place (already sharded), from config.init_from's weights if set."""
        loaded = self.start_weights and place(self.start_weights(), self.state_shardings.params)
        init = jax.jit(self.programs.init_state, out_shardings=self.state_shardings, donate_argnums=0)
        options = once_options(jax.default_backend())
        return compile_in_process(init.lower(loaded), self.mesh.devices.flat, options)(loaded)

    def restore_or_init(self, checkpointer: ckpt.Checkpointer | None) -> tuple[TrainState, Any]:
        """(state, its ckpt.Restored record): the latest checkpoint (corrupt ones set aside), or a fresh
        state (and None) when there is none."""
        restored = checkpointer and checkpointer.restore_latest(
            self.abstract_state(),
            set_aside=True,
            reset_optimizer=self.reset_optimizer,
            restart_if_all_corrupt=self.config.train.restart_if_all_corrupt,
        )
        if restored is None:
            return self.fresh_state(), None
        logging.info("restored step %d from %s", restored.step, checkpointer.directory)
        state = restored.state
        if state.opt_state is None:
            logging.warning(
                "train.reset_optimizer: step %d's parameters with a fresh optimizer state", restored.step
            )
            init = jax.jit(self.optimizer.init, out_shardings=self.state_shardings.opt_state)
            state = state._replace(opt_state=init(state.params))
        return state, restored


def _steps_for_epochs(config: Experiment, examples: int | None) -> Experiment:
    """A copy of `config` whose train.steps run train.epochs passes over the training set."""
    t = config.train
    if examples is None:
        raise ValueError(
            f"train.epochs: the size of this training set ({config.data.kind} data) is not counted; "
            "give train.steps instead"
        )
    return config.replace(train={"steps": math.ceil(t.epochs * max(1, examples // t.batch_size))})


def _section_identity(settings: dict, arch_name: str) -> dict:
    """The architecture's own config section (of the run's settings, as run_config.json stores them), when
    it shapes the saved state."""
    entry = ARCHITECTURES.get(arch_name)
    if not entry.section or not entry.identity:
        return {}
    section = settings[entry.section]
    fields = section if entry.identity is True else entry.identity
    return {entry.section: {k: section[k] for k in fields}}


class NoCheckpointError(FileNotFoundError):
    """eval / generate found nothing to load."""


def _check_batch(batch: dict, abstract: dict) -> None:
    """The first batch has the shapes the step was compiled for (one clear error, not XLA's)."""
    shapes = {k: (v.shape[0] * jax.process_count(), *v.shape[1:]) for k, v in batch.items()}
    expected = {k: v.shape for k, v in abstract.items()}
    if shapes != expected:
        raise ValueError(
            f"the training batches hold {shapes}, but the step was compiled for {expected} "
            "(train.batch_size x data.seq_len)"
        )


def _host_window(window: list[dict]) -> list[dict]:
    """The logging window as Python floats: what checkpoints store and averages are taken over (in float64,
    so a window restored from a checkpoint averages exactly as the uninterrupted run's)."""
    return [{k: float(v) for k, v in m.items()} for m in jax.device_get(window)]


def _host_scalars(metrics: dict) -> dict:
    return {k: float(v) for k, v in jax.device_get(metrics).items()}


def _mean_metrics(window: list[dict]) -> dict:
    host = _host_window(window)
    return {k: float(np.mean([m[k] for m in host])) for k in host[0]}


def run_eval(run: Run, params: dict, model_state: Any, eval_step=None) -> dict:
    """Teacher-forced metrics, plus generation exact match when eval.generate is on."""
    cfg = run.config.eval
    step = eval_step or make_eval_step(run.arch)
    metrics = evaluate(step, params, model_state, run.data.eval_batches(), cfg.score, cfg.bpb_masking)
    if cfg.generate:
        if run.data.generation_examples is None:
            raise ValueError(
                f"eval.generate is on but task {run.config.data.task!r} has no generation examples"
            )
        gen, _ = evaluate_generation(
            run.arch,
            params,
            model_state,
            run.data.generation_examples(),
            decode=run.data.decode,
            score=run.data.score,
            max_new_tokens=cfg.max_new_tokens,
            eos_id=run.data.eos_id,
            pad_id=run.data.pad_id,
            batch_size=cfg.batch_size,
            **sampling_settings(run.config),
        )
        metrics.update(gen)
    return metrics


def train(run: Run) -> dict:
    """Train to config.train.steps (resuming from the workdir), evaluate, and write summary.json. The
    session holds the workdir's lock throughout (WorkdirLockedError before anything is read or written if
    another live session holds it) and records in sessions.jsonl where it started and how it ended."""
    lead = is_lead_host()
    with workdir_lock(run.workdir, lead=lead), full_disk.told_once():
        try:
            return _train(run, lead)
        except Exception as e:
            if not full_disk.is_no_space(e):
                raise
            raise out_of_space(run, e, lead) from None


def _train(run: Run, lead: bool) -> dict:
    t = run.config.train
    # Nothing is written to the workdir before the starting state exists (a bad init_from fails first).
    resuming = bool(saved_steps(run.workdir / CHECKPOINTS))
    checkpointer = run.checkpointer() if resuming else None
    state, restored = run.restore_or_init(checkpointer)
    checkpointer = checkpointer or run.checkpointer()
    if lead and resuming and restored is None:  # train.restart_if_all_corrupt: the history moves aside too
        for path in (run.workdir / METRICS, run.workdir / SUMMARY):
            if path.exists():
                logging.warning("%s moved to %s", path, move_aside(path, run.workdir / CORRUPT))
    if lead:
        run_config.write_run_config(run.workdir, run.identity, run.settings)
        log_session(run.workdir, "start", int(state.step))
        if restored is not None:
            print(
                f"resumed from step {restored.step} ({checkpointer.directory / str(restored.step)})",
                flush=True,
            )
    if run.changes and restored is not None:
        shown = "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in run.changes)
        logging.warning("resuming %s at step %d with changed settings: %s", run.workdir, restored.step, shown)
    startup.mark("state")
    compiled: dict[Any, Any] = {}  # one compiled step per value of the architecture's per-step sample

    def compiled_step(sample) -> Any:
        """The step for `sample`, compiled from the state's and a batch's shapes rather than from a batch:
        the first is compiled before the input pipeline starts, so no data thread competes with tracing."""
        if sample not in compiled:
            first = not compiled
            jitted = run.programs.train_step(sample)
            traced = jitted.trace(run.abstract_state(), run.abstract_batch())
            if first:
                startup.mark("trace")
            compiled[sample] = compile_in_process(traced.lower(), run.mesh.devices.flat)
            if first:
                startup.mark("compile")
        return compiled[sample]

    def sample_at(step: int):
        return run.arch.sample(run.config.seed, step) if run.arch.sample else None

    def step_fn(step: int, state: TrainState, batch: dict) -> tuple[TrainState, dict]:
        sample = sample_at(step)
        state, metrics = compiled_step(sample)(state, batch)
        return state, metrics if sample is None else {**metrics, **sample._asdict()}

    start_step = int(state.step)
    if start_step < t.steps:
        with jax.set_mesh(run.mesh):
            compiled_step(sample_at(start_step + 1))
    iterator = run.data.train_iterator()
    if restored is not None:
        iterator.set_state(restored.data_state)
    eval_step = in_process(make_eval_step(run.arch), run.mesh.devices.flat)
    param_stats = in_process(jax.jit(run.arch.param_stats), run.mesh.devices.flat)
    started = time.time()
    profile = ProfileWindow(t.profile_steps, run.workdir / PROFILE)
    window: list[dict] = list(restored.log_window) if restored else []
    last_saved = checkpointer.steps()
    stopped_by, skips, step = None, 0, start_step
    progress = tqdm.tqdm(
        total=t.steps,
        initial=start_step,
        disable=not (t.progress and lead),
        desc=run.arch.name,
        dynamic_ncols=True,
    )
    with MetricsLog(run.workdir, resume_step=start_step) as log, jax.set_mesh(run.mesh):
        try:
            with stop_on_signals() as stop:
                for step in range(start_step + 1, t.steps + 1):
                    first = step == start_step + 1
                    batch = model_inputs(next(iterator))
                    if first:
                        startup.mark("data")
                        _check_batch(batch, run.abstract_batch())
                    with profile.step(step):
                        state, metrics = step_fn(step, state, global_batch(batch, run.mesh))
                    profile.after(step, state)
                    if bool(metrics.pop("finite")):  # one host sync per step: the guard's price
                        window.append(metrics)
                    else:
                        skips = non_finite(step, metrics, skips, t, log, last_saved)
                    if first:
                        startup.mark("first_step")
                        if lead:
                            startup.write(
                                run.workdir, step=step, compilation_cache=jax.config.jax_compilation_cache_dir
                            )
                    progress.update(1)
                    if window and (step % t.log_every == 0 or step == t.steps):
                        # the window's mean, and the parameters' statistics as they are now (taken on
                        # logging steps only)
                        summary = {**_mean_metrics(window), **_host_scalars(param_stats(state.params))}
                        window = []
                        if run.flops_per_step:  # expected training FLOPs spent so far (the x axis of budgets)
                            summary["train_flops"] = step * run.flops_per_step
                        log.write(step, "train", summary)
                        shown = {"loss": f"{summary['loss']:.4f}", "acc": f"{summary['accuracy']:.3f}"}
                        if "bpb" in summary:
                            shown["bpb"] = f"{summary['bpb']:.3f}"
                        progress.set_postfix(shown)
                    if t.eval_every and step % t.eval_every == 0 and step != t.steps:
                        log.write(step, "eval", run_eval(run, state.params, state.model_state, eval_step))
                    force = stop.signal is not None or step == t.steps
                    if force or checkpointer.due(step):
                        checkpointer.save(
                            step, state, iterator.get_state(), force=True, log_window=_host_window(window)
                        )
                        last_saved.append(step)
                    if stop.signal is not None:
                        stopped_by = signal.Signals(stop.signal).name
                        break
            checkpointer.wait()
        except NonFiniteError:
            if lead:
                log_session(run.workdir, "end", step, how="nonfinite")
            raise
        finally:
            profile.close()
            progress.close()
            checkpointer.close()
        final_step = int(state.step)
        if stopped_by:  # saved: rerunning the same command resumes
            if lead:
                log_session(run.workdir, "end", final_step, how=stopped_by)
            return {"stopped_by": stopped_by, "step": final_step}
        results = run_eval(run, state.params, state.model_state, eval_step)
        log.write(final_step, "eval", results)
    summary = {
        "arch": run.arch.name,
        "num_params": run.num_params,
        "steps": final_step,
        **(
            {"flops_per_step": run.flops_per_step, "train_flops": run.flops_per_step * final_step}
            if run.flops_per_step
            else {}
        ),
        **tokens_read(run.config, final_step),
        "train_seconds_this_session": round(time.time() - started, 1),
        "eval": results,
    }
    if lead:
        write_atomic(run.workdir / SUMMARY, json.dumps(json_safe(summary), indent=2))
        log_session(run.workdir, "end", final_step, how="finished")
    return summary


def tokens_read(config: Experiment, steps: int) -> dict:
    """Text training: the token positions `steps` read and, with data.train_tokens, the unique ones among
    them (the rest revisit them: epochs)."""
    if config.data.kind != "text":
        return {}
    read = steps * config.train.batch_size * config.data.seq_len
    cap = config.data.train_tokens
    return {"train_tokens_read": read, **({"train_tokens_unique": min(read, cap)} if cap else {})}


def check_loadable(workdir: Path, config: Experiment) -> None:
    """eval / generate: raise NoCheckpointError when there is nothing to evaluate (no checkpoint in the
    workdir, no config.init_from), before anything is built or any folder created."""
    if not (saved_steps(workdir / CHECKPOINTS) or pretrained_path(config)):
        raise NoCheckpointError(
            f"no checkpoint in {workdir / 'checkpoints'} and no checkpoint in config.init_from "
            f"({config.init_from!r}): train first, or pass --config.init_from=<checkpoint> to evaluate a "
            "pretrained model"
        )


def restore_state(run: Run) -> tuple[TrainState, int]:
    """The state to evaluate or sample: the workdir's latest checkpoint and its step, or, when the workdir
    has none, config.init_from's weights at step 0. An error if there is neither; the workdir is not
    touched (no checkpoints/ folder is created)."""
    if saved_steps(run.workdir / CHECKPOINTS):
        checkpointer = run.checkpointer()
        try:
            restored = checkpointer.restore_latest(run.abstract_state(), reset_optimizer=run.reset_optimizer)
        finally:
            checkpointer.close()
        if restored is not None:
            return restored.state, restored.step
    if run.start_weights is None:
        raise NoCheckpointError(
            f"no loadable checkpoint in {run.workdir / 'checkpoints'} and no config.init_from (see the "
            "warnings above for why each failed)"
        )
    return run.fresh_state(), 0
