"""The persistent compilation cache: on by default ("auto": the user's cache directory), off when the
path is empty, elsewhere when a directory is named, and yielding to one that is already configured. That
a rerun reads every program from it: tests/test_main.py."""

import jax
import pytest

from t2mlr_jax.config.edit import config_module
from t2mlr_jax.train.compilation_cache import DEFAULT, USER_CACHE, enable_compilation_cache
from tests.experiments import ROOT


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
