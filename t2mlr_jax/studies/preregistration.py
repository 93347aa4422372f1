"""Pre-registration: before a study trains anything it writes, into its --out, every row's recipe, the
claims with their margins and the git commit (`PREREGISTRATION`); its results carry the same commit, and a
claim is judged only when every run of both its rows was trained under the recipe recorded for the row
(`unregistered`: the runs that were not). A recipe is what a row is trained with: the optimizer section
(rates, multiplier, schedule, warmup, clipping, decay), the batch and the step budget, and the recurrent
gate's start."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from t2mlr_jax.storage.run_config import SETTINGS
from t2mlr_jax.storage.workdir import RUN_CONFIG
from t2mlr_jax.studies import ROOT

PREREGISTRATION = "preregistration.json"
TRAIN_FIELDS = ("steps", "batch_size", "grad_accum", "flop_budget")


class RecipeMismatch(ValueError):
    """The study's --out was pre-registered with other recipes or claims than this command's."""


def commit(root: Path = ROOT) -> str:
    """The checkout's HEAD, "+dirty" when tracked files differ from it ("unknown" outside a git checkout);
    by default this package's own checkout, wherever the command runs from."""
    git = ["git", "-C", str(root)]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode:
        return "unknown"
    dirty = subprocess.run(
        [*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    )
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def recipe(settings: Mapping) -> dict:
    """A row's recipe read off a resolved config's settings (a run's run_config.json holds the same)."""
    recurrence = (settings.get("model") or {}).get("recurrence") or {}
    return json.loads(
        json.dumps(
            {
                "optimizer": settings["optimizer"],
                "train": {k: settings["train"][k] for k in TRAIN_FIELDS},
                "gamma_recurrent_init": recurrence.get("gamma_recurrent_init"),
            },
            default=str,
        )
    )


def preregister(out: Path, recipes: Mapping[str, dict], claims: Sequence, meta: Mapping) -> dict:
    """Write <out>/preregistration.json (rows' recipes, claims with their margins, the commit, `meta`: the
    command, seeds, what was fixed before running) unless it is there already; a recorded one with other
    recipes or claims is refused (RecipeMismatch, nothing written): its rows were trained under it."""
    record = {
        "commit": commit(),
        "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "recipes": dict(recipes),
        "claims": [dataclasses.asdict(c) if dataclasses.is_dataclass(c) else dict(c) for c in claims],
        **meta,
    }
    record = json.loads(json.dumps(record, default=str))
    path = Path(out) / PREREGISTRATION
    if path.exists():  # a rerun, or more rows into the same study: the recorded entries stand
        recorded = json.loads(path.read_text())
        old_claims = {_claim_key(c): c for c in recorded["claims"]}
        changed = [r for r, v in record["recipes"].items() if recorded["recipes"].get(r, v) != v]
        changed += [f"claim {k}" for c in record["claims"] if old_claims.get(k := _claim_key(c), c) != c]
        if changed:
            raise RecipeMismatch(
                f"{path} pre-registered another recipe for {', '.join(changed)} at commit "
                f"{recorded['commit']}: use a fresh --out (nothing was changed)"
            )
        new_claims = [c for c in record["claims"] if _claim_key(c) not in old_claims]
        if set(record["recipes"]) <= set(recorded["recipes"]) and not new_claims:
            return recorded
        record = {
            **recorded,
            "recipes": {**record["recipes"], **recorded["recipes"]},
            "claims": recorded["claims"] + new_claims,
        }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1))
    return record


def _claim_key(claim: Mapping) -> str:
    return f"{claim['row']} vs {claim['baseline']}"


def unregistered(registration: Mapping, row: str, workdirs: Sequence[Path]) -> list[str]:
    """The runs of `row` (their workdirs) trained under another recipe than the one pre-registered for it:
    "<workdir>: <field>" for each, empty when all match."""
    wanted = registration["recipes"].get(row)
    if wanted is None:
        return [f"{row}: no recipe pre-registered"]
    bad = []
    for workdir in workdirs:
        path = Path(workdir) / RUN_CONFIG
        settings = json.loads(path.read_text()).get(SETTINGS) if path.exists() else None
        if settings is None:
            bad.append(f"{workdir}: no {RUN_CONFIG} settings")
            continue
        got = recipe(settings)
        fields = [k for k in wanted if got.get(k) != wanted[k]]
        if fields:
            bad.append(f"{workdir}: {', '.join(fields)}")
    return bad
