"""A run's identity and its record in workdir/run_config.json: which config sections a checkpoint depends
on (`run_identity`: architecture, model, baseline, data, seed), the refusal of a workdir that holds a run of
another config (`check_workdir`, before anything is compiled or any checkpoint touched, with the fields
that sections gained since the workdir was written filled in at their defaults), and the report of the
settings changed since the last session (`changed_settings`). It reads and writes JSON only, apart from
the orbax checkpoints of t2mlr_jax.storage.checkpoint, whose step folders depend on this identity.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from t2mlr_jax.config.sections import Baseline, Data, recurrence_settings
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.storage.workdir import RUN_CONFIG, write_atomic

IDENTITY_SECTIONS = ("arch", "model", "baseline", "data", "seed")
SETTINGS = "settings"  # run_config.json's record of the whole config of the last session


class WorkdirMismatchError(ValueError):
    """The workdir holds a run of another config."""


def run_identity(settings: dict) -> dict:
    """The config sections a checkpoint depends on; steps, logging and anything about evaluation
    (the eval section, data.eval_*) may change on resume."""
    d = dict(settings)
    d["data"] = {k: v for k, v in d["data"].items() if not k.startswith("eval_")}
    return _as_stored({k: d[k] for k in IDENTITY_SECTIONS})


# Identity sections whose dataclasses gain fields over time: a workdir written before a field existed was
# trained with the field's default (that is what the field's default means), so it still resumes.
GROWING_SECTIONS = {"model": ModelConfig, "baseline": Baseline, "data": Data}


def _defaults(cls: type) -> dict:
    return _as_stored(
        {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
    )


def _with_new_fields(stored: dict, identity: dict) -> dict:
    """A stored identity with the fields this identity has and its sections lacked, at their defaults."""

    def filled(section: dict, current: dict, cls: type) -> dict:
        defaults = _defaults(cls)
        return {**{k: defaults[k] for k in current if k not in section and k in defaults}, **section}

    out = dict(stored)
    for name, cls in GROWING_SECTIONS.items():
        if isinstance(out.get(name), dict) and isinstance(identity.get(name), dict):
            out[name] = filled(out[name], identity[name], cls)
    model, current = out.get("model"), identity.get("model")
    if (
        isinstance(model, dict)
        and isinstance(model.get("recurrence"), dict)
        and current
        and current.get("recurrence")
    ):
        out["model"] = {
            **model,
            "recurrence": filled(model["recurrence"], current["recurrence"], recurrence_settings()),
        }
    return out


def check_workdir(workdir: Path, identity: dict) -> None:
    """Raise WorkdirMismatchError naming the differing fields if workdir belongs to another run."""
    path = Path(workdir) / RUN_CONFIG
    if not path.exists():
        return
    stored = json.loads(path.read_text())
    stored.pop(SETTINGS, None)
    identity = _as_stored(identity)
    diffs = sorted(_diff(_with_new_fields(stored, identity), identity))
    if diffs:
        shown = "; ".join(f"{k}: {a!r} (workdir) vs {b!r} (this config)" for k, a, b in diffs[:5])
        raise WorkdirMismatchError(
            f"{workdir} holds a run of another config ({len(diffs)} differing fields: "
            f"{shown}). Use a fresh --workdir; nothing was changed."
        )


def changed_settings(workdir: Path, settings: dict) -> list[tuple[str, Any, Any]]:
    """(field, before, now) for each config field changed since the workdir's last session (fields that may
    change on resume: learning rates, steps, logging, evaluation)."""
    path = Path(workdir) / RUN_CONFIG
    if not path.exists():
        return []
    before = json.loads(path.read_text()).get(SETTINGS)
    return [] if before is None else _diff(before, _as_stored(settings))


def write_run_config(workdir: Path, identity: dict, settings: dict | None = None) -> None:
    """The run's identity (kept from the first session) and this session's settings (the whole config)."""
    path = Path(workdir) / RUN_CONFIG
    record = json.loads(path.read_text()) if path.exists() else _as_stored(identity)
    if settings is not None:
        record[SETTINGS] = _as_stored(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(record, indent=2, sort_keys=True))


def _as_stored(tree: Any) -> Any:
    return json.loads(json.dumps(tree, default=str))  # tuples become lists, as in the file


def _diff(a: Any, b: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in _diff(a.get(k), b.get(k), f"{prefix}{k}.")]
    return [] if a == b else [(prefix.rstrip("."), a, b)]
