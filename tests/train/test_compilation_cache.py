"""The persistent compilation cache is on by default (config.compilation_cache) and yields to one that is
already configured."""

import jax

from t2mlr_jax.config_utils import config_module
from t2mlr_jax.train.compilation_cache import DEFAULT, enable_compilation_cache
from tests.experiments import ROOT


def test_every_config_turns_it_on_and_a_configured_cache_wins(tmp_path):
    config = config_module(ROOT / "configs" / "s5_retrieval_t2mlr.py").get_config("cpu")
    assert config.compilation_cache == DEFAULT
    session = jax.config.jax_compilation_cache_dir  # the test session's (conftest)
    assert session and enable_compilation_cache(str(tmp_path)) == session
    try:
        jax.config.update("jax_compilation_cache_dir", None)
        assert enable_compilation_cache("") is None and not jax.config.jax_compilation_cache_dir
        assert enable_compilation_cache(str(tmp_path / "xla")) == str(tmp_path / "xla")
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "xla")
    finally:
        jax.config.update("jax_compilation_cache_dir", session)
