"""Run by test_kill.py in a subprocess: train the tiny run of ARCH (t2mlr | lrt) in WORKDIR, and optionally
signal itself (SIGKILL: a crash) when the iterator is asked for batch AT, or (PAUSE) wait there until the
file WORKDIR.go exists, having created WORKDIR.paused."""

import os
import signal
import sys
from pathlib import Path

import jax

jax.config.update("jax_compilation_cache_dir", os.environ["T2MLR_TEST_JAX_CACHE"])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)

from t2mlr_jax.train.trainer import train  # noqa: E402
from tests.faults.tiny_run import pausing_source, run, signalling_source  # noqa: E402


def main(workdir: str, at: int, signame: str, arch: str) -> None:
    if signame == "PAUSE":
        source = pausing_source(at, Path(f"{workdir}.paused"), Path(f"{workdir}.go"))
    else:
        source = signalling_source(at, getattr(signal, signame)) if at else None
    summary = train(run(workdir, source=source, arch=arch))
    print("stopped_by" in summary and "STOPPED" or "DONE", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])
