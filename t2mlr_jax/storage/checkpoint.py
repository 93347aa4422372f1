"""Checkpoints: the only module that talks to orbax (training checkpoints, and the folders of exported
models that t2mlr_jax.interop.orbax_folder reads and writes).

A checkpoint holds the train state (params, optimizer state, step, RNG), the data iterator's state and a
meta record (a fingerprint of every state leaf, computed on device, and what a reader outside the trainer
needs: the architecture, its model config, the tokenizer — so a step folder converts and initialises
runs on its own, see t2mlr_jax.interop.orbax_folder) and the metrics of the logging window in progress
(so a resumed run logs the same averages as an uninterrupted one). Saves are async, every `save_every`
steps, keeping `keep`.

`restore_latest` walks back from the newest step. A checkpoint that fails to load or whose fingerprints
disagree is proven corrupt, and the previous one is tried; once one loads, the corrupt ones are moved aside
to workdir/corrupt_checkpoints/ (never deleted, and no longer in the way of the next saves). When none
loads, training refuses to start over silently: nothing is moved unless train.restart_if_all_corrupt asks
for a fresh start. A checkpoint that loads but whose
state has another structure than this run's is not corrupt: it is a config change (`check_resumable`),
refused before anything is compiled, or, for the optimizer state only and when asked, restored without it.
The run's identity that a workdir's checkpoints depend on (workdir/run_config.json) is
t2mlr_jax.storage.run_config's.
"""

from __future__ import annotations

import base64
import functools
import logging
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from t2mlr_jax.model import layer_layout
from t2mlr_jax.parallel.multihost import to_host
from t2mlr_jax.storage import full_disk
from t2mlr_jax.storage.workdir import CORRUPT, move_aside, saved_steps


class StateMismatchError(ValueError):
    """A checkpoint's state has another structure than this run's (e.g. the optimizer changed)."""


class AllCorruptError(ValueError):
    """Every checkpoint of a run to resume is unreadable."""


# Fingerprint versions (meta["fingerprint"]; checkpoints without it have version 1). Version 1 weighted
# positions by i * 2654435761 + 1, even at odd i: a flipped high bit there (a sign bit at half the
# positions) changed nothing mod 2^32 and a corrupt checkpoint loaded. Version 2's weights are all odd, so
# every single flipped bit changes the sum.
FINGERPRINT = 2
_MULTIPLIERS = {1: 2654435761, 2: (2 * 2654435761) % 2**32}


@functools.partial(jax.jit, static_argnums=1)
def _fingerprints(leaves: list, version: int) -> jax.Array:
    def one(x):
        bits = jax.lax.bitcast_convert_type(x, jnp.dtype(f"uint{8 * x.dtype.itemsize}")).astype(jnp.uint32)
        position = jax.lax.iota(jnp.uint32, x.size).reshape(x.shape)
        weights = position * jnp.uint32(_MULTIPLIERS[version]) + jnp.uint32(1)
        return jnp.sum(bits * weights, dtype=jnp.uint32)

    return jnp.stack([one(x) for x in leaves])


def fingerprints(tree: Any, version: int = FINGERPRINT) -> list[int]:
    """One uint32 per leaf, in tree order: the position-weighted sum of its bits mod 2^32. It detects a
    checkpoint that loads but is corrupt (any one flipped bit, from version 2 on), is computed where the
    state lives (sharded over any mesh and any hosts: no host copy of the state), and is exact, since
    integer sums do not depend on the reduction order: a state restored onto another mesh has the same
    fingerprints."""
    return [int(v) for v in to_host(_fingerprints(jax.tree.leaves(tree), version))]


class _SavedState(NamedTuple):
    """A train state as checkpoints store it (the layout of checkpoints written before `model_state`
    existed); the model state is its own item, absent when it has no arrays, so old checkpoints restore."""

    step: Any
    params: Any
    opt_state: Any
    rng: Any


def _split(state: Any) -> tuple[Any, Any]:
    """(the stored state item, the model_state item) of a train state (a NamedTuple of step, params,
    opt_state, rng and model_state); other pytrees are stored whole."""
    if hasattr(state, "model_state"):
        return _SavedState(state.step, state.params, state.opt_state, state.rng), state.model_state
    return state, {}


def _join(core: Any, model_state: Any, target: Any) -> Any:
    """The restored state, of the type of the caller's restore target."""
    if isinstance(core, _SavedState):
        return target._replace(**core._asdict(), model_state=model_state)
    return core


def _encode_data_state(state: Any) -> dict:
    """grain iterator states are dicts (dataset API) or bytes (DataLoader API); store either as JSON."""
    if isinstance(state, bytes):
        return {"bytes": base64.b64encode(state).decode()}
    return {"json": state}


def _decode_data_state(stored: dict) -> Any:
    return base64.b64decode(stored["bytes"]) if "bytes" in stored else stored["json"]


class Restored(NamedTuple):
    state: Any  # of the restore target's type; opt_state None if restored without it (train.reset_optimizer)
    data_state: Any
    step: int
    log_window: list  # the metrics of the logging window in progress at the save


def _leaf_signature(tree: Any) -> dict[tuple[str, ...], tuple]:
    """{path: (shape, dtype)} of a pytree's leaves, with attribute names, dict keys and sequence indices
    alike, as orbax's metadata records them."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {
        tuple(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path): (
            tuple(leaf.shape),
            str(leaf.dtype),
        )
        for path, leaf in flat
    }


def _item_metadata(item_folder: Path) -> Any:
    """The stored tree (shapes and dtypes) of one array item of a step folder, without reading arrays."""
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)  # an item folder has no step metadata file, and orbax warns so
    try:
        with ocp.PyTreeCheckpointer() as checkpointer:
            return dict(checkpointer.metadata(Path(item_folder).absolute()).item_metadata)
    finally:
        absl_logger.setLevel(level)


def state_mismatch(step_folder: Path, abstract_state: Any) -> list[str]:
    """The top-level fields of a checkpoint's state (step, params, opt_state, rng) whose leaves differ from
    `abstract_state`'s in path, shape or dtype; [] when it fits. Raises if the metadata is unreadable."""
    stored = _leaf_signature(_item_metadata(Path(step_folder) / "state"))
    current = _leaf_signature(_split(abstract_state)[0])
    return sorted({path[0] for path, _ in set(stored.items()) ^ set(current.items())})


def _refuse_mismatch(differing: list[str], step: int, directory: Path, reset_optimizer: bool, changes):
    """A checkpoint of another state structure is a config change, never a corrupt file: refuse it, unless
    only the optimizer state differs and train.reset_optimizer asks to start it afresh."""
    if not differing or (differing == ["opt_state"] and reset_optimizer):
        return
    if differing == ["opt_state"]:
        changed = "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in changes if k.startswith("optimizer."))
        raise StateMismatchError(
            f"the optimizer state saved at step {step} in {directory} does not fit this config's optimizer "
            f"({changed or 'its structure changed'}): resume with the optimizer it was saved with, or pass "
            "--config.train.reset_optimizer=True to keep the saved parameters and start a fresh optimizer "
            "state. Nothing was changed."
        )
    raise StateMismatchError(
        f"the state saved at step {step} in {directory} has another structure ({', '.join(differing)}) "
        "than this config's: use a fresh --workdir. Nothing was changed."
    )


def check_resumable(directory: Path, abstract_state: Any, *, reset_optimizer: bool, changes=()) -> bool:
    """Before anything compiles: does the newest checkpoint with readable metadata fit this run's state?
    True when its optimizer state will be reset (asked for); StateMismatchError when it does not fit;
    False otherwise (or when there is nothing to resume)."""
    for step in reversed(saved_steps(directory)):
        try:
            differing = state_mismatch(Path(directory) / str(step), abstract_state)
        except Exception:  # noqa: BLE001 -- unreadable: restore_latest sets it aside and tries the previous
            continue
        _refuse_mismatch(differing, step, directory, reset_optimizer, changes)
        return bool(differing)
    return False


class Checkpointer:
    def __init__(
        self,
        directory: Path,
        *,
        save_every: int,
        keep: int,
        async_save: bool = True,
        about: dict[str, Any] | None = None,
    ):
        """`about`: JSON-able facts written into every checkpoint's meta record (architecture, model)."""
        self.directory = Path(directory).absolute()
        self.about = dict(about or {})
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                save_interval_steps=max(int(save_every), 1),
                max_to_keep=keep,
                enable_async_checkpointing=async_save,
            ),
            item_names=("state", "model_state", "data", "meta"),
        )

    def steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def due(self, step: int) -> bool:
        """Whether `step` is on the save interval."""
        return self._manager.should_save(step)

    def save(
        self, step: int, state: Any, data_state: Any, *, force: bool = False, log_window: list = ()
    ) -> bool:
        """Save if `step` is on the interval (or `force`). The state is copied first: the train step
        donates its buffers, and an async write must not read memory a later step reuses. `log_window`:
        JSON-able metrics of the steps since the last logged one."""
        if not (force or self.due(step)):
            return False
        self._manager.wait_until_finished()  # the previous save is on disk (or its error raised here)
        full_disk.require_space(self.directory, self._save_bytes(state))
        state = jax.tree.map(lambda x: x.copy(), state)
        core, model_state = _split(state)
        meta = {
            **self.about,
            "step": int(step),
            "fingerprints": fingerprints((core, model_state)),
            "fingerprint": FINGERPRINT,
            "log_window": list(log_window),
        }
        items = dict(
            state=ocp.args.StandardSave(core),
            data=ocp.args.JsonSave(_encode_data_state(data_state)),
            meta=ocp.args.JsonSave(meta),
        )
        if jax.tree.leaves(model_state):  # orbax refuses an empty item
            items["model_state"] = ocp.args.StandardSave(model_state)
        return self._manager.save(step, args=ocp.args.Composite(**items), force=True)

    def _save_bytes(self, state: Any) -> int:
        """What a save writes: the newest finished checkpoint's size, else the state's bytes and a margin
        for orbax's metadata (measured: ~40 kB and <10% on a tiny state)."""
        steps = self.steps()
        if steps and (self.directory / str(steps[-1])).is_dir():
            return full_disk.folder_bytes(self.directory / str(steps[-1]))
        return int(1.1 * sum(x.nbytes for x in jax.tree.leaves(state))) + 2**16

    def restore_latest(
        self,
        abstract_state: Any,
        *,
        set_aside: bool = False,
        reset_optimizer: bool = False,
        restart_if_all_corrupt: bool = False,
    ) -> Restored | None:
        """The newest loadable checkpoint, or None if there is none. `set_aside` (training): move each
        corrupt checkpoint newer than the one restored to workdir/corrupt_checkpoints/, so that saves of
        its step happen again. When every checkpoint is corrupt, training refuses (AllCorruptError, nothing
        moved) unless `restart_if_all_corrupt` sets them all aside and returns None (a fresh start).
        `reset_optimizer`: a checkpoint whose optimizer state does not fit is restored without it."""
        corrupt: list[tuple[int, Exception]] = []
        for step in reversed(self.steps()):
            try:
                differing = state_mismatch(self.directory / str(step), abstract_state)
                _refuse_mismatch(differing, step, self.directory, reset_optimizer, ())
                restored = self._restore(step, abstract_state, with_optimizer=not differing)
            except StateMismatchError:
                raise
            except Exception as e:  # noqa: BLE001 -- any failure to load means: try the previous one
                logging.warning(
                    "checkpoint at step %d in %s is unreadable (%s: %s); trying the previous one",
                    step,
                    self.directory,
                    type(e).__name__,
                    str(e)[:200],
                )
                corrupt.append((step, e))
                continue
            if set_aside:
                self._set_aside([s for s, _ in corrupt])
            return restored
        if corrupt and set_aside:
            if not restart_if_all_corrupt:
                shown = ", ".join(f"step {s} ({type(e).__name__}: {str(e)[:80]})" for s, e in corrupt)
                raise AllCorruptError(
                    f"every checkpoint in {self.directory} is unreadable: {shown}. Nothing was changed; "
                    "pass --config.train.restart_if_all_corrupt=True to move them to "
                    f"{self.directory.parent / CORRUPT} and train from step 0"
                )
            self._set_aside([s for s, _ in corrupt])
        return None

    def _set_aside(self, steps: list[int]) -> None:
        """Move these step folders to workdir/corrupt_checkpoints/ (never deleted, never overwritten)."""
        for step in steps:
            target = move_aside(self.directory / str(step), self.directory.parent / CORRUPT)
            logging.warning("unreadable checkpoint %s moved to %s", self.directory / str(step), target)
        if steps:
            self._manager.reload()

    def _restore(self, step: int, abstract_state: Any, *, with_optimizer: bool) -> Restored:
        core, abstract_model_state = _split(abstract_state)
        has_model_state = bool(jax.tree.leaves(abstract_model_state))
        items = dict(data=ocp.args.JsonRestore(), meta=ocp.args.JsonRestore())
        if has_model_state:
            items["model_state"] = ocp.args.StandardRestore(abstract_model_state)
        if with_optimizer:
            restored = self._manager.restore(
                step, args=ocp.args.Composite(state=ocp.args.StandardRestore(core), **items)
            )
        else:  # the state item without opt_state, read by a checkpointer of its own (partial restore)
            core = {"step": core.step, "params": core.params, "rng": core.rng}
            restore_args = ocp.checkpoint_utils.construct_restore_args(core)
            partial = ocp.args.PyTreeRestore(item=core, restore_args=restore_args, partial_restore=True)
            with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as checkpointer:
                restored = checkpointer.restore(
                    self.directory / str(step), args=ocp.args.Composite(state=partial, **items)
                )
        model_state = restored.model_state if has_model_state else abstract_model_state
        stored, version = restored.meta["fingerprints"], restored.meta.get("fingerprint", 1)
        if with_optimizer:
            state, expected = _join(restored.state, model_state, abstract_state), stored
            actual = fingerprints((restored.state, model_state), version)
        else:  # stored leaf order: step, params, opt_state, rng, model_state
            got = restored.state
            n_params, n_model = len(jax.tree.leaves(got["params"])), len(jax.tree.leaves(model_state))
            expected = stored[: 1 + n_params] + stored[len(stored) - 1 - n_model :]
            actual = fingerprints((got["step"], got["params"], got["rng"], model_state), version)
            state = abstract_state._replace(**got, opt_state=None, model_state=model_state)
        if actual != expected:
            raise ValueError("fingerprint mismatch")
        meta = restored.meta
        return Restored(state, _decode_data_state(restored.data), step, meta.get("log_window", []))

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.close()


# ---------------------------------------------------------------------------------------------
# Reading a training checkpoint outside the trainer (export, init_from): no optimizer, no mesh.


def is_step_folder(path: Path | str) -> bool:
    return (Path(path) / "state").is_dir() and (Path(path) / "meta").is_dir()


def read_step_params(step_folder: Path | str) -> Any:
    """The parameters of one training checkpoint as numpy arrays, read without the optimizer state, with
    the blocks' weights stacked whichever form they were trained in (model.scan_layers)."""
    path = Path(step_folder).absolute() / "state"
    stored = _item_metadata(path)["params"]
    with ocp.PyTreeCheckpointer() as checkpointer:
        target = {"params": jax.tree.map(lambda m: np.zeros((), m.dtype), stored)}
        restored = checkpointer.restore(
            path,
            args=ocp.args.PyTreeRestore(
                item=target,
                restore_args=jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), target),
                partial_restore=True,
            ),
        )
    return layer_layout.stacked(restored["params"])


# ---------------------------------------------------------------------------------------------
# A folder of arrays plus JSON metadata items (exported models: t2mlr_jax.interop.orbax_folder).


def save_folder(path: Path | str, *, params: Any, metadata: dict[str, Any]) -> None:
    """Write `params` (item "params") and each JSON-able metadata value (one item per key)."""
    items = {
        "params": ocp.args.StandardSave(params),
        **{k: ocp.args.JsonSave(v) for k, v in metadata.items()},
    }
    with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as checkpointer:
        checkpointer.save(Path(path).absolute(), args=ocp.args.Composite(**items))


def read_folder_metadata(path: Path | str, name: str) -> Any:
    """One metadata item of a folder, without reading any array."""
    with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as checkpointer:
        stored = checkpointer.restore(
            Path(path).absolute(), args=ocp.args.Composite(**{name: ocp.args.JsonRestore()})
        )
    return stored[name]


def read_folder_arrays(path: Path | str, target: Any) -> Any:
    """The folder's "params" item, restored onto `target` (ShapeDtypeStructs)."""
    with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as checkpointer:
        restored = checkpointer.restore(
            Path(path).absolute(), args=ocp.args.Composite(params=ocp.args.StandardRestore(target))
        )
    return restored["params"]
