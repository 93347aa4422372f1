"""Run by test_resume.py in a subprocess: train ARCH's tiny config (t2mlr, or lrt with MoE state, sampled
pass counts and Muon) in WORKDIR, and optionally signal itself (SIGKILL: a crash; SIGTERM: a preemption)
when the iterator is asked for batch KILL_AT."""

import os
import signal
import sys

import jax

jax.config.update("jax_compilation_cache_dir", os.environ["T2MLR_TEST_JAX_CACHE"])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)

sys.path.insert(0, os.path.dirname(__file__))
from tiny_task import TinyIterator, tiny_config, tiny_lrt_config, tiny_source  # noqa: E402

from t2mlr_jax.train.trainer import Run, train  # noqa: E402


class SignallingIterator(TinyIterator):
    def __init__(self, kill_at: int, signum: int, *args):
        super().__init__(*args)
        self.kill_at, self.signum = kill_at, signum

    def __next__(self):
        if self.index + 1 == self.kill_at:
            os.kill(os.getpid(), self.signum)
        return super().__next__()


def lrt_config():
    """P sampled from {1, 2} (draws 2 2 1 2 | 2 1 1 2 2 around the crash at 5): each distinct P traces and
    compiles its own step in every run, and P = 3, 4 would only make those steps longer."""
    config = tiny_lrt_config(steps=9, checkpoint_every=2)
    config.lrt.passes, config.lrt.pass_probs = (1, 2), (0.5, 0.5)
    return config


CONFIGS = {
    "t2mlr": lambda: tiny_config("t2mlr", steps=9, checkpoint_every=2),
    "lrt": lrt_config,
}


def main(arch: str, workdir: str, kill_at: int, signame: str) -> None:
    source = tiny_source()
    if kill_at:
        source = source._replace(
            train_iterator=lambda: SignallingIterator(kill_at, getattr(signal, signame), 0, 8, 16)
        )
    summary = train(Run(CONFIGS[arch](), workdir, source, arch))
    print("stopped_by" in summary and "STOPPED" or "DONE", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
