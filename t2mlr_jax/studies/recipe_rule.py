"""The rule every study's recipe is chosen by, fixed before any comparison runs, so that no row is tuned
toward a result: one learning-rate multiplier over all of a recipe's rates (optimizer.lr_multiplier),
swept on the baseline row only, on seeds no comparison uses; the multiplier with the best mean held-out
metric is the swept one; it is halved (for every row alike) until each row of the study, probed on the
sweep seeds, trains without diverging, and that is recorded in the config and used unchanged. A run whose
training loss rises above ln V (a uniform guess) after its first `AFTER_STEP` steps has diverged: it is
counted and shown, never dropped, and a sweep never chooses a multiplier at which any seed diverged."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

AFTER_STEP = 10  # warmup's overshoot is allowed this long
SWEEP_SEEDS = (100, 101)  # the sweeps' and probes' seeds: no comparison reports them


def diverged(losses: Sequence[tuple[int, float]], vocab_size: int, after: int = AFTER_STEP) -> bool:
    """Whether a run's logged training losses ((step, loss)) rose above ln `vocab_size` (or stopped being
    finite) at any step after `after`."""
    bound = math.log(vocab_size)
    return any(step > after and not loss <= bound for step, loss in losses)


def count_diverged(runs: Mapping[str, bool]) -> dict:
    """{"diverged": how many, "runs": their names, "of": how many runs} over {run name: diverged}."""
    names = sorted(name for name, bad in runs.items() if bad)
    return {"diverged": len(names), "runs": names, "of": len(runs)}


def sweep_means(cells: Mapping[float, Mapping[int, float]]) -> dict[float, float]:
    """Each multiplier's mean metric over its seeds (nan where a seed diverged: its metric is nan)."""
    return {m: float(np.mean(list(by_seed.values()))) for m, by_seed in cells.items()}


def choose_multiplier(
    cells: Mapping[float, Mapping[int, float]], lower_is_better: bool = True, diverged_cells: Sequence = ()
) -> float:
    """The rule: the multiplier whose mean metric over the sweep seeds is best; one with a diverged seed
    (listed in `diverged_cells`, or a non-finite metric) is never chosen; a tie goes to the smaller one.
    Every multiplier must have run the same seeds."""
    seeds = {m: sorted(by_seed) for m, by_seed in cells.items()}
    if len({tuple(s) for s in seeds.values()}) != 1:
        raise ValueError(f"every multiplier needs the same sweep seeds, got {seeds}")
    means = {
        m: mean for m, mean in sweep_means(cells).items() if m not in diverged_cells and math.isfinite(mean)
    }
    if not means:
        raise ValueError("every multiplier of the sweep diverged on some seed: widen the grid downward")
    sign = 1 if lower_is_better else -1
    return min(sorted(means), key=lambda m: sign * means[m])


def stable_multiplier(swept: float, diverged_at: Mapping[float, int]) -> float:
    """The rule's stability step: the swept multiplier, halved while a probe of every row of the study on
    the sweep seeds had diverged runs (`diverged_at`: probed multiplier -> how many diverged). The answer is
    the study's multiplier once `diverged_at` shows it at 0, else the next one to probe."""
    if swept <= 0:
        raise ValueError(f"the swept multiplier must be > 0, got {swept}")
    multiplier = swept
    while diverged_at.get(multiplier, 0) > 0:
        multiplier /= 2
    return multiplier
