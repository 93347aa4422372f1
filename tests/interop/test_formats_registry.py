"""The checkpoint formats' registry (t2mlr_jax.formats.registry): what convert_checkpoint accepts is what is
registered, a system's release layout is registered by importing its package, and recognition tries the
release layouts before the HF folder they also are."""

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from t2mlr_jax.formats.registry import CATCH_ALL, in_order
from t2mlr_jax.interop.pretrained import checkpoint_format, formats

TOOL = Path(__file__).parents[2] / "tools" / "convert_checkpoint.py"
tool = runpy.run_path(str(TOOL))  # its functions, without running main


@pytest.mark.parametrize("name", formats().names())
def test_every_registered_format_is_a_direction_of_convert_checkpoint(name, tmp_path):
    entry = formats().get(name)
    other = "hf" if name == "orbax" else "orbax"
    args = tool["parse_args"](["--from", name, "--to", other, str(tmp_path / "a"), str(tmp_path / "b")])
    assert args.source_format == name
    if entry.save is not None:
        args = tool["parse_args"](["--from", other, "--to", name, str(tmp_path / "a"), str(tmp_path / "b")])
        assert args.target_format == name


def test_the_generic_formats_and_every_release_layout_are_registered():
    assert set(formats().names()) >= {"gguf", "hf", "nanochat", "orbax", "ponderlm2", "t2mlr-torch"}


def test_hf_is_recognised_last():
    order = [entry.name for entry in in_order()]
    assert order[-1] == "hf" and formats().get("hf").priority == CATCH_ALL
    assert order.index("t2mlr-torch") < order.index("hf") and order.index("ponderlm2") < order.index("hf")


def test_a_release_folder_is_its_layout_not_hf(tmp_path):
    (tmp_path / "release").mkdir()
    (tmp_path / "release" / "config.json").write_text(json.dumps({"model_type": "t2mlr"}))
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert checkpoint_format(tmp_path / "release") == "t2mlr-torch"
    assert checkpoint_format(tmp_path / "llama") == "hf"


@pytest.mark.slow
@pytest.mark.parametrize(
    "module, registered",
    [
        ("t2mlr_jax.architectures.t2mlr.architecture", "'t2mlr-torch' in FORMATS"),
        ("t2mlr_jax.architectures.ponderlm2", "'ponderlm2' in FORMATS"),
        ("t2mlr_jax.architectures.lrt", "'use_interleaved' in VARIANTS"),
    ],
)
def test_a_system_registers_its_release_format_when_its_package_is_imported(module, registered):
    code = (
        "import importlib\n"
        "from t2mlr_jax.formats.registry import FORMATS\n"
        "from t2mlr_jax.formats.nanochat import VARIANTS\n"
        f"assert not ({registered})\n"
        f"importlib.import_module({module!r})\n"
        f"assert {registered}\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
