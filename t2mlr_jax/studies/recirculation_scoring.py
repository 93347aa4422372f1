"""How the recirculation sweep (recirculation_sweep.py) scores a cell: the next-token NLL of the unmodified
model, a recirculation pathway or the looping control over the fixed eval windows, one compiled function
per (source, destination, scheme) with alpha traced; a cells.jsonl line per cell; the serial check."""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from t2mlr_jax.architectures.recirculation.forward import looped_logits, recirculated_logits
from t2mlr_jax.architectures.recirculation.mix import Recirculation
from t2mlr_jax.config.sections import Experiment
from t2mlr_jax.model import backbone
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.token_layout import make_layout
from t2mlr_jax.studies.protocol import Convergence
from t2mlr_jax.train.build_data import build_data_source

POSITION_BUCKETS = 16  # the gain-by-position curve: the window cut into this many equal spans
INPUTS = ("tokens", "targets", "positions", "segment_ids")  # what the compiled scorer reads of a batch


@dataclasses.dataclass(frozen=True)
class Cell:
    """One scored variant: the unmodified model ("baseline"), a recirculation pathway, the looping control
    over the same blocks, or a serial check (a recirculation cell scored by both evaluations, timed)."""

    kind: str  # baseline | recirculation | looping | check
    source: int = -1
    destination: int = -1
    scheme: str = ""
    alpha: float = 0.0


@dataclasses.dataclass(frozen=True)
class Scoring:
    """How recirculation cells are scored (config.recirculation), and the temperatures every cell's
    next-token NLL is taken at (the first is the sweep's; a second is the temperature control)."""

    stack: str = "two"
    evaluation: str = "parallel"
    tol: float = 1e-4
    max_passes: int = 16
    ramp: bool = False
    temperatures: tuple[float, ...] = (1.0,)


def windows(config: Experiment) -> list[dict]:
    """The eval windows as numpy batches, read once and reused by every cell."""
    data = build_data_source(config, train=False)
    return [{k: np.asarray(v) for k, v in batch.items()} for batch in data.eval_batches()]


@functools.partial(jax.jit, static_argnames=("model", "cell", "scoring"))
def _token_nll(params: dict, batch: dict, alpha, *, model: ModelConfig, cell: Cell, scoring: Scoring):
    """[temperatures, B, T] next-token NLL of `cell`, the Jacobi passes it ran and their last change. The
    cell's alpha is the traced `alpha`, so every alpha of a pathway shares one compile."""
    tokens = batch["tokens"]
    layout = make_layout(tokens, batch["positions"], batch["segment_ids"])
    if cell.kind == "baseline":
        kw = dict(positions=layout.positions, segment_ids=layout.segment_ids)
        logits, passes, change = backbone.forward(model, params, tokens, **kw), jnp.int32(0), jnp.float32(0)
    else:
        rc = Recirculation(cell.source, cell.destination, alpha, cell.scheme or "ratio", scoring.ramp)
        if cell.kind == "looping":
            logits = looped_logits(model, params, rc, tokens, layout=layout)
            passes, change = jnp.int32(0), jnp.float32(0)
        else:
            logits, passes, change = recirculated_logits(
                model,
                params,
                rc,
                tokens,
                layout,
                stack=scoring.stack,
                evaluation=scoring.evaluation,
                tol=scoring.tol,
                max_passes=scoring.max_passes,
            )
    logits, targets = logits.astype(jnp.float32), batch["targets"]
    nll = [optax.softmax_cross_entropy_with_integer_labels(logits / t, targets) for t in scoring.temperatures]
    return jnp.stack(nll), passes, change


def _arguments(params: dict, batch: dict, cell: Cell) -> tuple:
    return params, {k: batch[k] for k in INPUTS}, np.float32(cell.alpha)


def scorer(model: ModelConfig, cell: Cell, scoring: Scoring, *, compile_for=None) -> Callable:
    """(params, batch, alpha) -> (NLL per temperature [N, B, T], passes, change) for `cell`; with
    compile_for=(params, batch) compiled ahead of time (so that timing it excludes compilation)."""
    kind = "recirculation" if cell.kind == "check" else cell.kind
    static = dict(model=model, cell=dataclasses.replace(cell, kind=kind, alpha=0.0), scoring=scoring)
    if compile_for is None:
        return functools.partial(_token_nll, **static)
    return _token_nll.lower(*_arguments(*compile_for, cell), **static).compile()


def score(params: dict, batches: list[dict], cell: Cell, fn: Callable, window: int) -> dict:
    """`cell` scored by `fn` (a `scorer`) over `batches` (numpy, from `windows`): its summed NLL at each
    temperature, supervised tokens, their UTF-8 bytes, NLL per position bucket, NLL (sweep temperature) and
    tokens per window (the selection and report splits), passes and the last pass's change per batch,
    seconds."""
    nll_sums, by_position = 0.0, np.zeros(POSITION_BUCKETS)
    tokens = target_bytes = 0.0
    nll_by_window, tokens_by_window = [], []
    passes, changes, start = [], [], time.perf_counter()
    for batch in batches:
        nll, n, change = fn(*_arguments(params, batch, cell))
        nll, mask = np.asarray(nll, np.float64), batch["loss_mask"] > 0
        nll_sums = nll_sums + (nll * mask).sum(axis=(1, 2))
        by_position += np.bincount(_buckets(batch, window), weights=nll[0][mask], minlength=POSITION_BUCKETS)
        tokens += float(mask.sum())
        nll_by_window += (nll[0] * mask).sum(axis=1).tolist()
        tokens_by_window += mask.sum(axis=1).tolist()
        target_bytes += float(batch["target_bytes"][mask].sum()) if "target_bytes" in batch else 0.0
        passes.append(int(n))
        changes.append(float(change))
    if not tokens:
        raise ValueError("the eval windows hold no supervised tokens: is the eval set empty?")
    return {
        "nll": np.atleast_1d(nll_sums).tolist(),
        "tokens": tokens,
        "bytes": target_bytes,
        "nll_by_position": by_position.tolist(),
        "nll_by_window": nll_by_window,
        "tokens_by_window": tokens_by_window,
        "passes": passes,
        "changes": changes,
        "seconds": time.perf_counter() - start,
    }


def _buckets(batch: dict, window: int) -> np.ndarray:
    """The position bucket of each supervised token (its position in its document within the window)."""
    positions = batch["positions"][batch["loss_mask"] > 0]
    return np.minimum(positions * POSITION_BUCKETS // window, POSITION_BUCKETS - 1)


def position_counts(batches: list[dict], window: int) -> np.ndarray:
    """Supervised tokens per position bucket (the same for every cell)."""
    return sum(np.bincount(_buckets(b, window), minlength=POSITION_BUCKETS) for b in batches)


def perplexity(nll_sum: float, tokens: float) -> float:
    return math.exp(min(nll_sum / tokens, 50.0))


def change_pct(ppl: float, base: float) -> float:
    return 100.0 * (ppl / base - 1.0)


def record(cell: Cell, raw: dict, baseline: dict | None, tol: float) -> dict:
    """A cells.jsonl line: the cell, its sums, perplexity / bpb and the % change against the baseline
    (at the sweep's temperature; a second temperature is the control). A parallel evaluation's passes
    and convergence: its largest last-pass change against `tol`, `converged` false where a batch stopped
    at the cap still moving (None where the evaluation does not measure it: the single-stack's)."""
    ppl = [perplexity(n, raw["tokens"]) for n in raw["nll"]]
    base = baseline["perplexity"] if baseline else ppl[0]
    out = {**dataclasses.asdict(cell), **raw, "perplexity": ppl[0], "change_pct": change_pct(ppl[0], base)}
    if raw["bytes"]:
        out["bpb"] = raw["nll"][0] / (math.log(2.0) * raw["bytes"])
    if len(ppl) > 1:
        out["control_temperature"] = {"perplexity": ppl[1], "change_pct": change_pct(ppl[1], base)}
    passes, changes = out.pop("passes"), out.pop("changes")
    if any(passes):  # Jacobi passes: the parallel evaluation only
        out["passes"] = {"mean": float(np.mean(passes)), "max": max(passes)}
        final = float(np.max(changes))  # NaN where not measured
        measured = not math.isnan(final)
        out["final_change"] = final if measured else None
        out["converged"] = Convergence(max(passes), final, tol).converged if measured else None
    return out


def serial_check(
    model: ModelConfig, params: dict, batches: list[dict], cell: Cell, scoring: Scoring, window: int
) -> dict:
    """`cell` scored by the parallel and the serial evaluation side by side, each compiled first: the
    passes the parallel one needs, how far its perplexity is from the serial one's, the speed-up."""
    out = dataclasses.asdict(cell)
    for mode in ("parallel", "serial"):
        start = time.perf_counter()
        fn = scorer(
            model, cell, dataclasses.replace(scoring, evaluation=mode), compile_for=(params, batches[0])
        )
        compile_seconds = time.perf_counter() - start
        scored = record(cell, score(params, batches, cell, fn, window), None, scoring.tol)
        out[mode] = {
            "perplexity": scored["perplexity"],
            "seconds": scored["seconds"],
            "compile_seconds": compile_seconds,
            **{k: scored[k] for k in ("passes", "final_change", "converged") if k in scored},
        }
    parallel, serial = out["parallel"], out["serial"]
    out["perplexity_rel_diff"] = abs(parallel["perplexity"] - serial["perplexity"]) / serial["perplexity"]
    out["speedup"] = serial["seconds"] / parallel["seconds"]
    return out
