"""The comparison protocol every study shares, so that a table's effect can be told from its noise.

- Bits per byte as nanochat's evaluation defines it (eval.bpb_masking="nanochat": a target of zero UTF-8
  bytes, a special token, is left out of both sums), defined for the run (eval.require_bpb).
- Seeds: at least `MIN_SEEDS` per row; a row's mean, standard deviation and 95% Student-t interval, its
  paired difference to the baseline (seed by seed: the same init and data order) with its interval, and a
  verdict on a paper's claim that an interval including zero cannot give (`compare`; `markdown` writes
  the study's table, the noise floor under it).
- Selection and report on disjoint splits: whatever is chosen (α, a layer pair, a best cell) is chosen on
  one, and reported on the other.
- Equal data: rows revisit one token stream (data.train_tokens, epochs) rather than read further into it;
  each row's summary records its unique and read training tokens (`check_equal_data`).
- Budgets matched in FLOPs (train.flop_budget: the steps a row's count, head and every pass included,
  affords); the head's share of them reported (`head_share`), small where the blocks carry the compute.
- Convergence: an iteration stopped at its cap reports its final change, and is marked unconverged.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
from jaxtyping import Int
from scipy import stats

MIN_SEEDS = 3
CONFIDENCE = 0.95
REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced at this scale", "not reproduced", "inconclusive"


@dataclasses.dataclass(frozen=True)
class Interval:
    """A mean over n values with its standard deviation and `CONFIDENCE` Student-t interval."""

    mean: float
    std: float
    low: float
    high: float
    n: int

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    @property
    def includes_zero(self) -> bool:
        return self.low <= 0.0 <= self.high

    def text(self, digits: int = 3) -> str:
        return f"{self.mean:.{digits}f} ± {self.half_width:.{digits}f}"


def interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """Mean, sample standard deviation and the t interval of the mean of `values` (n ≥ 2)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size < 2:
        raise ValueError(f"an interval needs at least 2 values, got {x.size}")
    std = float(x.std(ddof=1))
    half = float(stats.t.ppf((1 + confidence) / 2, x.size - 1)) * std / math.sqrt(x.size)
    mean = float(x.mean())
    return Interval(mean, std, mean - half, mean + half, int(x.size))


def check_seeds(seeds: Sequence[int]) -> None:
    if len(set(seeds)) < MIN_SEEDS:
        raise ValueError(f"a row needs at least {MIN_SEEDS} distinct seeds, got {sorted(set(seeds))}")


def paired_difference(row: Mapping[int, float], baseline: Mapping[int, float]) -> Interval:
    """The interval of row − baseline over the seeds both ran (the same init and data order)."""
    missing = sorted(set(row) ^ set(baseline))
    if missing:
        raise ValueError(f"paired difference: seeds {missing} ran for only one of the two rows")
    return interval([row[seed] - baseline[seed] for seed in sorted(row)])


def verdict(difference: Interval, paper_sign: int, margin: float = 0.0) -> str:
    """A paper's claim that the row moves the metric in direction `paper_sign` (−1: lowers it, as BPB
    for a better model), judged by the paired difference's interval. `paper_sign` 0 claims no difference
    (one training method matches another): reproduced when the whole interval lies within ±`margin`,
    not reproduced when it lies wholly outside, inconclusive otherwise."""
    if paper_sign not in (-1, 0, 1):
        raise ValueError(f"paper_sign must be -1, 0 or 1, got {paper_sign}")
    if paper_sign == 0:
        if margin <= 0:
            raise ValueError(f"a claim of no difference needs a margin > 0, got {margin}")
        if -margin <= difference.low and difference.high <= margin:
            return REPRODUCED
        return NOT_REPRODUCED if difference.low > margin or difference.high < -margin else INCONCLUSIVE
    if difference.includes_zero:
        return INCONCLUSIVE
    return REPRODUCED if np.sign(difference.mean) == paper_sign else NOT_REPRODUCED


@dataclasses.dataclass(frozen=True)
class Splits:
    """Disjoint item indices: choices are made on `selection`, results reported on `report`."""

    selection: Int[np.ndarray, " s"]
    report: Int[np.ndarray, " r"]


def splits(items: int, selection_fraction: float = 0.5, seed: int = 0) -> Splits:
    """A seeded shuffle of range(items) cut into a selection part and a report part, neither empty."""
    cut = round(items * selection_fraction)
    if not 0 < cut < items:
        raise ValueError(
            f"{items} items at selection_fraction {selection_fraction} leave a split empty: need more items"
        )
    order = np.random.default_rng(seed).permutation(items)
    return Splits(np.sort(order[:cut]), np.sort(order[cut:]))


def check_equal_data(summaries: Mapping[str, dict]) -> None:
    """Every row saw the same unique text (its summary's `train_tokens_unique`, data.train_tokens): a row
    that read further into the stream, or was not capped, is refused."""
    unique = {name: summary.get("train_tokens_unique") for name, summary in summaries.items()}
    if None in unique.values() or len(set(unique.values())) > 1:
        raise ValueError(f"rows saw different unique data (tokens; None: not capped): {unique}")


def head_share(train_flops_at: Callable[[int], float], vocab_size: int) -> float:
    """The vocabulary's share of a row's training FLOPs, every head pass counted, from its count at two
    vocabulary sizes: the count is linear in the vocabulary (the head, and PonderLM-2's vocabulary pass,
    are its only vocabulary-sized matmuls; embeddings are lookups), so the head's part is the difference
    between the count at `vocab_size` and at 1, scaled to the whole vocabulary."""
    full, one = train_flops_at(vocab_size), train_flops_at(1)
    return (full - one) * vocab_size / (vocab_size - 1) / full


@dataclasses.dataclass(frozen=True)
class Convergence:
    """A capped iteration's end: its passes, the last pass's change and the tolerance it was held to."""

    passes: int
    final_change: float
    tolerance: float

    @property
    def converged(self) -> bool:
        return self.final_change <= self.tolerance

    def marked(self, result: dict, refuse: bool = False) -> dict:
        """`result` with the convergence recorded; unconverged: marked, or refused with `refuse`."""
        if refuse and not self.converged:
            raise ValueError(
                f"unconverged after {self.passes} passes: final change {self.final_change:.3g} > "
                f"tolerance {self.tolerance:.3g}"
            )
        return {**result, **dataclasses.asdict(self), "converged": self.converged}


@dataclasses.dataclass(frozen=True)
class Claim:
    """A paper's claim that `row` moves the metric from `baseline`'s in direction `sign` (−1: lowers it;
    0: leaves it within ±`margin`), with the paper's own figure as printed (e.g. "−0.03 BPB")."""

    row: str
    baseline: str
    paper: str
    sign: int
    margin: float = 0.0


def compare(values: Mapping[str, Mapping[int, float]], claims: Sequence[Claim]) -> dict:
    """Rows' metric per seed -> each row's interval, each claim's paired difference to its baseline and its
    verdict, and the noise floor: the seed-to-seed standard deviation of the claims' baselines (their
    root mean square)."""
    unknown = sorted({name for c in claims for name in (c.row, c.baseline)} - set(values))
    if unknown:
        raise ValueError(f"claims name rows {unknown} that are not among the rows {sorted(values)}")
    for by_seed in values.values():
        check_seeds(list(by_seed))
    rows = {row: interval(list(by_seed.values())) for row, by_seed in values.items()}
    judged = []
    for claim in claims:
        difference = paired_difference(values[claim.row], values[claim.baseline])
        judged.append(
            {
                **dataclasses.asdict(claim),
                "difference": dataclasses.asdict(difference),
                "verdict": verdict(difference, claim.sign, claim.margin),
            }
        )
    baselines = sorted({c.baseline for c in claims})
    floor = math.sqrt(np.mean([rows[b].std ** 2 for b in baselines])) if baselines else float("nan")
    return {
        "rows": {row: dataclasses.asdict(i) for row, i in rows.items()},
        "claims": judged,
        "noise_floor": floor,
        "noise_rows": baselines,
    }


def markdown(comparison: dict, metric: str, digits: int = 3) -> str:
    """A study's table: every row's mean ± 95% half-width, then each claim with the paper's figure, ours
    (the paired difference to its baseline) and the verdict; the noise floor under it."""
    as_interval = lambda d: Interval(**d).text(digits)
    lines = [f"| row | {metric} (mean ± 95%) | std | seeds |", "|---|---|---|---|"]
    lines += [
        f"| {row} | {as_interval(i)} | {i['std']:.{digits}f} | {i['n']} |"
        for row, i in comparison["rows"].items()
    ]
    lines += ["", f"| claim | paper | ours: Δ {metric} (95%) | verdict |", "|---|---|---|---|"]
    lines += [
        f"| {c['row']} vs {c['baseline']} | {c['paper']} | {as_interval(c['difference'])} | {c['verdict']} |"
        for c in comparison["claims"]
    ]
    floor, rows = comparison["noise_floor"], ", ".join(comparison["noise_rows"])
    return "\n".join(lines) + f"\n\nSeed-to-seed noise floor (std of {rows}): {floor:.{digits}f}\n"
