"""The suite's bounds on fp32 round-off, derived rather than guessed (docs/testing.md).

Two fp32 evaluations of one computation (parallel vs exact vs cached decoding, a mesh vs one device, ours vs
a release's) differ by round-off only, and XLA:CPU's round-off depends on the host: its kernels, vector
widths and reduction orders follow the instruction set it compiles for. A bound that holds on one CPU by
luck fails on the next, so every equality test takes its bound from one of two rules:

- By path depth (`assert_fp32_close`): |a - b| <= PER_BLOCK * blocks(depth) * u * scale, with u = 2^-24
  (fp32's unit round-off), `depth` the layers on the longest path from the inputs to the compared value
  (passes x layers; a recurrence's chain over its tokens; a gradient's path runs forward and back: twice
  its forward's), blocks(depth) = 2 depth + 2 its residual sublayers (attention, MLP) and its two ends
  (embedding, head), and `scale` the largest |value| of the reference (for a sum, such as a loss, the sum
  of its terms' magnitudes: summation's condition). Measured against float64 (tests/reference.py, the
  releases' fixtures) on every instruction set tried (native AVX-512, AVX2, SSE4.2), one fp32 path moves by
  at most ~1.7 u * scale per block (3.4 per layer: the pause model under SSE4.2); two paths differ by at
  most the sum, and PER_BLOCK = 4 leaves room above that. The release parity table uses the same rule
  (t2mlr_jax/studies/parity.py: U, PER_BLOCK and blocks live there).
- Against float64 (`assert_near_f64`): where the computation has a float64 evaluation (the naive loops of
  tests/reference.py, or the same JAX function with x64 on: `in_float64`), an fp32 path passes when
  |path - f64| <= MULTIPLE * |reference path - f64| + blocks(depth) * u * scale: no worse than MULTIPLE x the
  error that the fp32 reference path itself makes on this CPU, with one rounding per block as a floor (so
  that a reference path that happens to land on the float64 value does not demand the impossible). This is
  the rule for sums whose terms cancel (a weight's gradient over a batch), where the largest |value| says
  little of the round-off.

A bound that is not either (a bitwise equality, a bf16 path, an analytic constant) says why beside it.
Planted bugs move values by > 1e-3 of their scale, orders of magnitude above every bound here, and the
checks that show it (a deliberate mistake must fail) keep their own margins.

With T2MLR_HEADROOM set to a file, every check appends {test, what, error, bound} to it as one JSON line:
`make test-isa` tabulates each bound's headroom (error / bound) under every instruction set
(python -m tests.headroom).
"""

import json
import os

import jax
import numpy as np

from t2mlr_jax.studies.parity import PER_BLOCK, U, blocks, max_abs_diff

MULTIPLE = 4  # the float64 rule: how much worse than the fp32 reference path a path may be


def scale_of(reference) -> float:
    return max(float(np.abs(np.asarray(reference, np.float64)).max()), 1e-30)


def fp32_bound(depth: int, scale: float) -> float:
    """The depth rule's bound on |a - b| for two fp32 paths `depth` layers deep, values up to `scale`."""
    return float(PER_BLOCK * blocks(depth) * U * scale)


def assert_fp32_close(got, want, depth: int, what: str = "values", scale: float | None = None) -> float:
    """`got` and `want`, two fp32 paths `depth` layers deep, agree to the depth rule; returns the error."""
    bound = fp32_bound(depth, scale_of(want) if scale is None else scale)
    return _check(max_abs_diff(got, want), bound, what)


def assert_near_f64(
    got, reference, exact, depth: int, what: str = "values", scale: float | None = None
) -> float:
    """`got` (an fp32 path) is within the float64 rule of `exact` (float64), measured against `reference`
    (the fp32 path it is meant to equal); returns the error. A sum's `scale` is the sum of its terms'
    magnitudes (summation's condition), not the result's."""
    assert np.asarray(exact).dtype == np.float64, f"{what}: the exact values are {np.asarray(exact).dtype}"
    scale = scale_of(exact) if scale is None else scale
    bound = MULTIPLE * max_abs_diff(reference, exact) + blocks(depth) * U * scale
    return _check(max_abs_diff(got, exact), bound, what)


def in_float64(fn, *args):
    """`fn(*args)` evaluated in float64 (x64 on, every float32 input cast): the same JAX computation's
    exact values, to the float64 rule's purpose (`assert_near_f64` refuses a value that came back fp32)."""
    widen = lambda a: jax.numpy.asarray(a, np.float64) if np.asarray(a).dtype == np.float32 else a
    with jax.enable_x64(True):
        return jax.device_get(fn(*jax.tree.map(widen, args)))


def assert_within(error: float, bound: float, what: str) -> float:
    """A figure derived from fp32 paths (a loss, a metric's log) within a bound derived from the rules;
    recorded like every check; returns the error."""
    return _check(float(error), float(bound), what)


def _check(error: float, bound: float, what: str) -> float:
    record(what, error, bound)
    assert error <= bound, f"{what}: max |error| {error:.3g} > its bound {bound:.3g} ({error / bound:.2f}x)"
    return error


def record(what: str, error: float, bound: float) -> None:
    """One check's headroom, appended to $T2MLR_HEADROOM when set (both xdist workers may append)."""
    path = os.environ.get("T2MLR_HEADROOM")
    if path:
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0].split("@")[0]  # no xdist group
        line = json.dumps({"test": test, "what": what, "error": error, "bound": bound}) + "\n"
        with open(path, "a") as out:
            out.write(line)
