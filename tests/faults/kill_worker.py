"""Run by test_kill.py in a subprocess: train ARCH's tiny run (t2mlr, or lrt with MoE state, sampled pass
counts and Muon) in WORKDIR, and optionally signal itself (SIGKILL: a crash; SIGTERM: a preemption) when the
iterator is asked for batch AT."""

import os
import signal
import sys

import jax

jax.config.update("jax_compilation_cache_dir", os.environ["T2MLR_TEST_JAX_CACHE"])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)

from t2mlr_jax.train.trainer import Run, train  # noqa: E402
from tests.faults.tiny_run import config, signalling_source  # noqa: E402
from tests.train.tiny_task import tiny_lrt_config, tiny_source  # noqa: E402


def lrt_config():
    """P sampled from {1, 2} (draws 2 2 1 2 | 2 1 1 2 2 around the crash at 5): each distinct P traces and
    compiles its own step in every run, and P = 3, 4 would only make those steps longer."""
    cfg = tiny_lrt_config(steps=9, checkpoint_every=2)
    cfg.lrt.passes, cfg.lrt.pass_probs = (1, 2), (0.5, 0.5)
    return cfg


CONFIGS = {"t2mlr": config, "lrt": lrt_config}


def main(arch: str, workdir: str, at: int, signame: str) -> None:
    source = signalling_source(at, getattr(signal, signame)) if at else tiny_source()
    summary = train(Run(CONFIGS[arch](), workdir, source, arch))
    print("stopped_by" in summary and "STOPPED" or "DONE", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
