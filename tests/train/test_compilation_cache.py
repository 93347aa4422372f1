"""The persistent compilation cache: on by default ("auto": the user's cache directory), off when the
path is empty, elsewhere when a directory is named, and yielding to one that is already configured. That
a rerun reads every program from it: tests/test_main.py. And the in-process one: runs in one process share
their executables."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2mlr_jax.config.edit import config_module
from t2mlr_jax.experiment import resolve
from t2mlr_jax.train import compilation_cache
from t2mlr_jax.train.compilation_cache import DEFAULT, USER_CACHE, enable_compilation_cache
from t2mlr_jax.train.trainer import Run, restore_state, train
from tests.experiments import ROOT
from tests.faults.tiny_run import assert_same_state
from tests.tiny import tiny_experiment
from tests.train.tiny_task import tiny_source


@pytest.fixture
def no_session_cache():
    session = jax.config.jax_compilation_cache_dir  # the test session's (conftest)
    jax.config.update("jax_compilation_cache_dir", None)
    yield session
    jax.config.update("jax_compilation_cache_dir", session)


def test_auto_is_the_user_cache_empty_is_off_and_a_named_directory_is_used(tmp_path, no_session_cache):
    config = config_module(ROOT / "configs" / "s5_retrieval_t2mlr.py").get_config("cpu")
    assert config.compilation_cache == DEFAULT == "auto"
    assert enable_compilation_cache("") is None and not jax.config.jax_compilation_cache_dir
    assert enable_compilation_cache(str(tmp_path / "xla")) == str(tmp_path / "xla")
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "xla")
    assert enable_compilation_cache(str(tmp_path)) == str(tmp_path / "xla")  # a configured cache wins


def test_auto_is_the_user_cache(no_session_cache):
    assert enable_compilation_cache(DEFAULT).endswith(USER_CACHE.removeprefix("~"))


@pytest.mark.slow
def test_runs_in_one_process_share_their_programs_and_train_as_if_compiled_alone(tmp_path, monkeypatch):
    """A second in-process run of one config with another seed compiles only its init (the seed is a
    constant of that program: drawn as every run before was; the train step, eval and statistics are the
    same programs) and ends in the state it reaches with every program compiled afresh."""

    def run(name: str, seed: int) -> Run:
        config = tiny_experiment("transformer", steps=2, eval_every=2)
        config.seed = seed
        return Run(resolve(config), tmp_path / name, tiny_source(), "transformer")

    monkeypatch.setattr(compilation_cache, "_COMPILED", {})  # none from the tests before
    train(run("a", 0))
    programs = dict(compilation_cache._COMPILED)
    train(run("b", 1))
    assert len(compilation_cache._COMPILED.keys() - programs.keys()) == 1  # seed 1's init
    shared = set(compilation_cache._COMPILED)
    monkeypatch.setattr(compilation_cache, "_COMPILED", {})
    train(run("c", 1))
    again = compilation_cache._COMPILED.keys()
    assert again <= shared and len(again) == len(programs)  # the same programs, compiled again
    assert_same_state(restore_state(run("b", 1))[0], restore_state(run("c", 1))[0])
    a, b = restore_state(run("a", 0))[0], restore_state(run("b", 1))[0]
    assert not np.array_equal(a.params["embed_tokens"], b.params["embed_tokens"])  # each seed its own weights


def test_in_process_compiles_once_per_argument_signature():
    f = compilation_cache.in_process(jax.jit(lambda x, y: x * y), jax.devices()[:1])
    before = len(compilation_cache._COMPILED)
    assert float(f(jnp.float32(2), jnp.float32(3))) == 6.0
    assert f(jnp.ones(3), jnp.float32(3)).tolist() == [3.0, 3.0, 3.0]  # another shape: another program
    assert float(f(jnp.float32(4), jnp.float32(5))) == 20.0  # the first one's
    assert len(compilation_cache._COMPILED) == min(before + 2, compilation_cache.KEEP)
    # the same text (an argument the program never reads is left out of it), other arguments: not shared
    for unused in (jnp.ones(3), jnp.ones(4)):
        g = compilation_cache.in_process(jax.jit(lambda x, y: x + 1), jax.devices()[:1])
        assert float(g(jnp.float32(1), unused)) == 2.0


def test_a_program_calling_back_into_python_is_never_shared():
    """Its text names the callback only by an index: two such programs share nothing."""
    seen = []

    def program(tag):
        def f(x):
            jax.debug.callback(lambda v: seen.append(tag), x)
            return x

        return compilation_cache.in_process(jax.jit(f), jax.devices()[:1])

    program("a")(jnp.ones(()))
    program("b")(jnp.ones(()))
    jax.effects_barrier()
    assert seen == ["a", "b"]


def test_only_the_most_recently_used_executables_are_kept(monkeypatch):
    monkeypatch.setattr(compilation_cache, "_COMPILED", {})
    monkeypatch.setattr(compilation_cache, "KEEP", 2)
    lowered = [jax.jit(lambda x: x + 1).lower(jnp.ones(n)) for n in (1, 2, 3)]
    keep = lambda i: compilation_cache.compile_in_process(lowered[i], jax.devices()[:1])
    first, _ = keep(0), keep(1)
    assert keep(0) is first  # used again: the second is now the oldest
    keep(2)
    assert len(compilation_cache._COMPILED) == 2 and keep(0) is first
    assert keep(1) is not None and len(compilation_cache._COMPILED) == 2  # the second compiled again
