"""The release's optional per-batch sampling of the Jacobi depth D (`batch_forward_approximate_depth_values`).

`t2mlr.d_forward_values` is "" (always model.recurrence.d_forward), a max "N" (uniform over
t2mlr.d_forward_min..N) or a list "8,16,32" (uniform over it). D is a static argument of the train step, so
each distinct value compiles once, on first use. One D per optimizer step (the release draws one per
micro-batch; our accumulation scans micro-batches inside one compiled step), drawn from (seed, step) alone
so that a resumed run draws the same depths.
"""

from __future__ import annotations

import random

from t2mlr_jax.config.sections import Experiment


def depth_values(config: Experiment) -> list[int] | None:
    """The depths t2mlr.d_forward_values allows, or None when D is fixed; one clear error for a bad spec."""
    spec, minimum = str(config.t2mlr.d_forward_values).strip(), config.t2mlr.d_forward_min
    if not spec:
        return None
    if config.t2mlr.forward_mode != "jacobi":  # architectures without the recurrence ignore D
        raise ValueError(
            "t2mlr.d_forward_values samples the Jacobi depth: it needs t2mlr.forward_mode='jacobi', "
            f"got {config.t2mlr.forward_mode!r}"
        )
    try:
        numbers = [int(v) for v in spec.replace(",", " ").split()]
    except ValueError:
        raise ValueError(
            f"t2mlr.d_forward_values must be a max depth 'N' or a list '8,16,32', got {spec!r}"
        ) from None
    if minimum < 1:
        raise ValueError(f"t2mlr.d_forward_min must be >= 1, got {minimum}")
    values = list(range(minimum, numbers[0] + 1)) if len(numbers) == 1 else sorted(set(numbers))
    if not values or values[0] < 1:
        raise ValueError(
            f"t2mlr.d_forward_values {spec!r} (with d_forward_min {minimum}) gives no depth >= 1"
        )
    return values


def draw_at(values: list, seed: int, step: int, weights: list[float] | None = None):
    """One of `values` (with `weights`, else uniform) for optimizer step `step`: a function of (seed, step)
    only, the same on every host and after a resume (the Jacobi depth D, the LRT's pass count P)."""
    rng = random.Random(seed * 1_000_003 + step)
    return rng.choice(values) if weights is None else rng.choices(values, weights)[0]
