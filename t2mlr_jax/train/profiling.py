"""A jax.profiler trace of a window of steps (`train.profile` = "START:STOP": steps START .. STOP - 1),
written to WORKDIR/profile/plugins/profile/<time>/: an .xplane.pb that TensorBoard's profile plugin opens
(`tensorboard --logdir WORKDIR/profile`) and a perfetto_trace.json.gz for ui.perfetto.dev.
t2mlr_jax.analysis.profile_ops reads the .xplane.pb back and names the slowest ops. Each step in the
window is annotated (StepTraceAnnotation), so the profile plugin's step view separates them; the trace
stops once the window's last step has finished, not when it was dispatched."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax


class ProfileWindow:
    """Starts the trace before step `start`, stops it after step `stop - 1`; inert when `window` is None
    (or when the run resumes past it: a window not entered whole is not traced)."""

    def __init__(self, window: tuple[int, int] | None, folder: Path):
        self.window, self.folder, self.active = window, folder, False

    def step(self, step: int):
        """A context around step `step`'s dispatch: its annotation while the trace runs."""
        if self.window and step == self.window[0]:
            self.folder.mkdir(parents=True, exist_ok=True)
            jax.profiler.start_trace(str(self.folder), create_perfetto_trace=True)
            self.active = True
        if self.active:
            return jax.profiler.StepTraceAnnotation("train", step_num=step)
        return contextlib.nullcontext()

    def after(self, step: int, outputs: Any) -> None:
        """Called once step `step` is dispatched: at the window's last step, waits for `outputs` and stops."""
        if self.active and step == self.window[1] - 1:
            jax.block_until_ready(outputs)
            self.close()

    def close(self) -> None:
        """Stops a trace still running (a run that ended inside the window keeps what it traced)."""
        if self.active:
            jax.profiler.stop_trace()
            self.active = False


def trace_calls(fn: Callable[[], Any], window: tuple[int, int], folder: Path) -> None:
    """A benchmark's profile: calls fn() numbered 1 .. STOP - 1, the calls START .. STOP - 1 traced into
    `folder` as ProfileWindow traces steps."""
    profile = ProfileWindow(window, folder)
    for call in range(1, window[1]):
        with profile.step(call):
            out = fn()
        profile.after(call, out)
