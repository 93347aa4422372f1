"""Checkpoints: the only module that talks to orbax (training checkpoints, and the folders of exported
models that t2mlr_jax.interop.orbax_folder reads and writes).

A checkpoint holds the train state (params, optimizer state, step, RNG), the data iterator's state and a
meta record (a fingerprint of every state leaf, computed on device, and what a reader outside the trainer
needs: the architecture, its model config, the tokenizer — so a step folder converts and initialises
runs on its own, see t2mlr_jax.interop.orbax_folder). Saves are async, every `save_every`
steps, keeping `keep`;
`restore_latest` walks back from the newest step and skips (with a warning) any checkpoint that fails to
load or whose fingerprints disagree, so a truncated or corrupt latest save falls back to the previous one.
The run's identity (architecture, model, data, seed) is written once to workdir/run_config.json; a
workdir holding another run is refused before anything is compiled or any checkpoint touched.
"""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from t2mlr_jax.parallel.multihost import to_host
from t2mlr_jax.train.train_step import TrainState
from t2mlr_jax.train.workdir import RUN_CONFIG

IDENTITY_SECTIONS = ("arch", "model", "baseline", "data", "seed")


class WorkdirMismatchError(ValueError):
    """The workdir holds a run of another config."""


def run_identity(config) -> dict:
    """The config sections a checkpoint depends on; steps, logging and anything about evaluation
    (the eval section, data.eval_*) may change on resume."""
    d = config.to_dict()
    d["data"] = {k: v for k, v in d["data"].items() if not k.startswith("eval_")}
    return json.loads(json.dumps({k: d[k] for k in IDENTITY_SECTIONS}, default=str))


def check_workdir(workdir: Path, identity: dict) -> None:
    """Raise WorkdirMismatchError naming the differing fields if workdir belongs to another run."""
    path = Path(workdir) / RUN_CONFIG
    if not path.exists():
        return
    stored = json.loads(path.read_text())
    diffs = sorted(
        _diff(stored, json.loads(json.dumps(identity, default=str)))
    )  # as stored: tuples are lists
    if diffs:
        shown = "; ".join(f"{k}: {a!r} (workdir) vs {b!r} (this config)" for k, a, b in diffs[:5])
        raise WorkdirMismatchError(
            f"{workdir} holds a run of another config ({len(diffs)} differing fields: "
            f"{shown}). Use a fresh --workdir; nothing was changed."
        )


def write_run_config(workdir: Path, identity: dict) -> None:
    path = Path(workdir) / RUN_CONFIG
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(identity, indent=2, sort_keys=True))


def _diff(a: Any, b: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in _diff(a.get(k), b.get(k), f"{prefix}{k}.")]
    return [] if a == b else [(prefix.rstrip("."), a, b)]


@jax.jit
def _fingerprints(leaves: list) -> jax.Array:
    def one(x):
        bits = jax.lax.bitcast_convert_type(x, jnp.dtype(f"uint{8 * x.dtype.itemsize}")).astype(jnp.uint32)
        weights = jax.lax.iota(jnp.uint32, x.size).reshape(x.shape) * jnp.uint32(2654435761) + jnp.uint32(1)
        return jnp.sum(bits * weights, dtype=jnp.uint32)

    return jnp.stack([one(x) for x in leaves])


def fingerprints(tree: Any) -> list[int]:
    """One uint32 per leaf, in tree order: the position-weighted sum of its bits mod 2^32. It detects a
    checkpoint that loads but is corrupt, is computed where the state lives (sharded over any mesh and any
    hosts: no host copy of the state), and is exact, since integer sums do not depend on the reduction
    order: a state restored onto another mesh has the same fingerprints."""
    return [int(v) for v in to_host(_fingerprints(jax.tree.leaves(tree)))]


class _SavedState(NamedTuple):
    """A TrainState as checkpoints store it (the layout of checkpoints written before `model_state`
    existed); the model state is its own item, absent when it has no arrays, so old checkpoints restore."""

    step: Any
    params: Any
    opt_state: Any
    rng: Any


def _split(state: Any) -> tuple[Any, Any]:
    """(the stored state item, the model_state item) of a TrainState; other pytrees are stored whole."""
    if isinstance(state, TrainState):
        return _SavedState(state.step, state.params, state.opt_state, state.rng), state.model_state
    return state, {}


def _join(core: Any, model_state: Any) -> Any:
    return TrainState(*core, model_state=model_state) if isinstance(core, _SavedState) else core


def _encode_data_state(state: Any) -> dict:
    """grain iterator states are dicts (dataset API) or bytes (DataLoader API); store either as JSON."""
    if isinstance(state, bytes):
        return {"bytes": base64.b64encode(state).decode()}
    return {"json": state}


def _decode_data_state(stored: dict) -> Any:
    return base64.b64decode(stored["bytes"]) if "bytes" in stored else stored["json"]


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

    def save(self, step: int, state: Any, data_state: Any, *, force: bool = False) -> bool:
        """Save if `step` is on the interval (or `force`). The state is copied first: the train step
        donates its buffers, and an async write must not read memory a later step reuses."""
        if not (force or self._manager.should_save(step)):
            return False
        state = jax.tree.map(lambda x: x.copy(), state)
        core, model_state = _split(state)
        meta = {**self.about, "step": int(step), "fingerprints": fingerprints((core, model_state))}
        items = dict(
            state=ocp.args.StandardSave(core),
            data=ocp.args.JsonSave(_encode_data_state(data_state)),
            meta=ocp.args.JsonSave(meta),
        )
        if jax.tree.leaves(model_state):  # orbax refuses an empty item
            items["model_state"] = ocp.args.StandardSave(model_state)
        return self._manager.save(step, args=ocp.args.Composite(**items), force=True)

    def restore_latest(self, abstract_state: Any) -> tuple[Any, Any, int] | None:
        """(state, data_state, step) of the newest loadable checkpoint, or None if there is none."""
        core, abstract_model_state = _split(abstract_state)
        has_model_state = bool(jax.tree.leaves(abstract_model_state))
        items = dict(
            state=ocp.args.StandardRestore(core), data=ocp.args.JsonRestore(), meta=ocp.args.JsonRestore()
        )
        if has_model_state:
            items["model_state"] = ocp.args.StandardRestore(abstract_model_state)
        for step in reversed(self.steps()):
            try:
                restored = self._manager.restore(step, args=ocp.args.Composite(**items))
                model_state = restored.model_state if has_model_state else abstract_model_state
                if fingerprints((restored.state, model_state)) != restored.meta["fingerprints"]:
                    raise ValueError("fingerprint mismatch")
            except Exception as e:  # noqa: BLE001 -- any failure to load means: try the previous one
                logging.warning(
                    "checkpoint at step %d in %s is unreadable (%s: %s); trying the previous one",
                    step,
                    self.directory,
                    type(e).__name__,
                    str(e)[:200],
                )
                continue
            return _join(restored.state, model_state), _decode_data_state(restored.data), step
        return None

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.close()


# ---------------------------------------------------------------------------------------------
# Reading a training checkpoint outside the trainer (export, init_from): no optimizer, no mesh.


def is_step_folder(path: Path | str) -> bool:
    return (Path(path) / "state").is_dir() and (Path(path) / "meta").is_dir()


def read_step_params(step_folder: Path | str) -> Any:
    """The parameters of one training checkpoint as numpy arrays, read without the optimizer state."""
    path = Path(step_folder).absolute() / "state"
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    with ocp.PyTreeCheckpointer() as checkpointer:
        absl_logger.setLevel(logging.ERROR)  # an item folder has no step metadata file, and orbax warns so
        try:
            stored = dict(checkpointer.metadata(path).item_metadata)["params"]
        finally:
            absl_logger.setLevel(level)
        target = {"params": jax.tree.map(lambda m: np.zeros((), m.dtype), stored)}
        restored = checkpointer.restore(
            path,
            args=ocp.args.PyTreeRestore(
                item=target,
                restore_args=jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), target),
                partial_restore=True,
            ),
        )
    return restored["params"]


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
