"""The slowest XLA ops of a jax.profiler trace (train.profile's, or a benchmark's --profile), read with the
profiler's own reader (jax.profiler.ProfileData) from the newest .xplane.pb under a trace folder.

An op event is one that names its HLO op (stat `hlo_op`: XLA:CPU's thunks, GPU / TPU kernels); its
`hlo_module` says which program ran it (jit_step, ...). Times are summed per (module, op) over the traced
steps; ops that run concurrently on several threads each count their own time, so the shares are of op
time, not of wall time."""

from __future__ import annotations

import collections
import re
from pathlib import Path

TRACE_GLOB = "plugins/profile/*/*.xplane.pb"
NUMBERED = re.compile(r"\.\d+$")  # XLA's instance suffix: dot.606 is one of the kind "dot"


def newest_trace(folder: Path) -> Path | None:
    """The newest trace file under `folder` (jax.profiler's layout), None if there is none."""
    traces = sorted(Path(folder).glob(TRACE_GLOB), key=lambda p: p.parent.name)
    return traces[-1] if traces else None


def slowest_ops(trace: Path, top: int = 10) -> dict:
    """{"trace", "op_seconds" (all ops), "ops": [{"module", "op", "calls", "seconds", "share"}, ...] the
    `top` slowest by total time, "kinds": the same over op kinds (the name without its instance number:
    a step's many small dots, fusions or copies add up there)}."""
    from jax.profiler import ProfileData

    totals: dict[tuple[str, str], list] = collections.defaultdict(lambda: [0, 0.0])
    for plane in ProfileData.from_file(str(trace)).planes:
        for line in plane.lines:
            for event in line.events:
                stats = dict(event.stats)
                if "hlo_op" in stats:
                    entry = totals[(str(stats.get("hlo_module", "")), str(stats["hlo_op"]))]
                    entry[0] += 1
                    entry[1] += event.duration_ns * 1e-9
    kinds: dict[tuple[str, str], list] = collections.defaultdict(lambda: [0, 0.0])
    for (module, op), (calls, seconds) in totals.items():
        kind = kinds[(module, NUMBERED.sub("", op))]
        kind[0] += calls
        kind[1] += seconds
    everything = sum(seconds for _, seconds in totals.values())
    return {
        "trace": str(trace),
        "op_seconds": everything,
        "ops": _ranked(totals, everything, top),
        "kinds": _ranked(kinds, everything, top),
    }


def _ranked(totals: dict, everything: float, top: int) -> list[dict]:
    ranked = sorted(totals.items(), key=lambda item: -item[1][1])[:top]
    return [
        {"module": module, "op": op, "calls": calls, "seconds": s, "share": s / everything}
        for (module, op), (calls, s) in ranked
    ]


def ops_lines(summary: dict, top: int = 5) -> list[str]:
    """The printed summary's lines: the `top` slowest ops with their share of op time."""
    lines = [f"slowest ops of the profiled steps ({summary['op_seconds']:.3g} s of op time):"]
    for title, key in (("by op", "ops"), ("by kind", "kinds")):
        lines.append(f"  {title}:")
        lines += [
            f"    {o['share']:6.1%}  {o['seconds']:8.4f} s  {o['calls']:>6} calls  {o['op']} ({o['module']})"
            for o in summary[key][:top]
        ]
    return lines
