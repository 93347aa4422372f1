"""Test-wide setup, before JAX or the package is imported:
- the CPU backend (JAX_PLATFORMS, unless set: with libtpu installed JAX would probe for a TPU first) with
  8 fake devices, for the sharding tests;
- XLA's fast-compiling CPU flags (tests/xla_flags.py), here and in the subprocesses tests start;
- the CPU runtime tuned as an entry point tunes it (t2mlr_jax.cpu_runtime.tune: XLA:CPU flags, malloc);
- a compilation cache shared by the main.py runs that tests start in a subprocess, but none in the
  pytest workers themselves: twice (once in CI, once here) a worker aborted inside XLA while serialising
  a CPU executable for the cache (jax 0.10.2, not reproducible alone), which takes the whole xdist run down;
- jaxtyping shape annotations checked at run time (beartype) on every public function of the library
  (t2mlr_jax but its studies);
- tests marked `slow` (setup.cfg; what `make test-fast` leaves out) first, so that the two xdist workers
  finish together rather than one of them waiting on a long test collected last;
- the shipped SmolLM2-135M-Instruct GGUF, parsed once per worker by our loader and by transformers (tests
  that use it join the xdist group "smollm2_gguf", so one worker parses it once).
"""

import os
import pkgutil
import tempfile

from tests.xla_flags import with_devices  # no JAX in it: the flags are set before JAX is imported

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = with_devices(8)  # with any flag the suite was started with (the instruction set)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# libtpu compiles for TPU topologies here (tests/parallel): no metadata server to ask, and both xdist workers
# may load it (parallel.tpu_topology sets these too, but a test may reach libtpu another way first)
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ.setdefault("T2MLR_TEST_JAX_CACHE", tempfile.mkdtemp(prefix="t2mlr-jax-cache-"))
# ... which main.py run in a subprocess also uses, rather than its default user cache.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.environ["T2MLR_TEST_JAX_CACHE"])

import t2mlr_jax  # noqa: E402
from t2mlr_jax import cpu_runtime  # noqa: E402  (imports JAX: after the variables it reads at import)

cpu_runtime.tune()

import jax  # noqa: E402
import pytest  # noqa: E402
from jaxtyping import install_import_hook  # noqa: E402

jax.config.update("jax_compilation_cache_dir", os.environ["T2MLR_TEST_JAX_CACHE"])  # main.py keeps it...
jax.config.update("jax_enable_compilation_cache", False)  # ... and never reads or writes it in a worker
# Every floor of the library; the studies (t2mlr_jax/studies/, programs on top of it) are not checked, as
# when they lived in experiments/.
install_import_hook(
    [f"t2mlr_jax.{m.name}" for m in pkgutil.iter_modules(t2mlr_jax.__path__) if m.name != "studies"],
    "beartype.beartype",
)


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: otherwise as collected


@pytest.fixture(scope="session")
def smollm2_gguf():
    """(ModelConfig, params) of the shipped GGUF, as `load_pretrained` reads it."""
    from configs.recipes import smollm2_tokenizer
    from t2mlr_jax.interop import load_pretrained

    return load_pretrained(smollm2_tokenizer())


@pytest.fixture(scope="session")
def smollm2_transformers():
    """(model, tokenizer): transformers' own reading of the shipped GGUF, fp32, eval mode."""
    from pathlib import Path

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from configs.recipes import smollm2_tokenizer

    gguf = Path(smollm2_tokenizer())
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    return model.eval(), AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
