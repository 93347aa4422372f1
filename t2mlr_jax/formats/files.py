"""Reading and writing PyTorch-style weight files as numpy state dicts (no JAX here).

Weights travel as `{key: np.ndarray}` in the checkpoint's own dtype (bfloat16 via ml_dtypes), so
every layout's conversion is plain numpy and the PyTorch reference can reuse these readers.
Supported: model.safetensors, sharded safetensors (model.safetensors.index.json), and
pytorch_model.bin (single or sharded), which is only unpickled with `weights_only=True`.
A file that cannot be read is a one-line ValueError naming it; `check_weight_files` finds most such files
from their headers alone, before anything else is done.

Every export writes into an empty (or new) folder: `check_export_target` refuses any other before
anything is converted, unless the caller asks to overwrite; then `clear_model_files` removes the files
that the new model's readers would otherwise find beside it (MODEL_FILES and any weight shard), leaving
anything else in the folder alone. Exports are written whole or not at all (`staged_folder`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import zipfile
from collections.abc import Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_BIN = "pytorch_model.bin"
TORCH_BIN_INDEX = "pytorch_model.bin.index.json"
# What a model folder's readers (our loaders, transformers' Auto* classes, the release) read from it: an
# export writes these (README.md is the converter's model card), and overwriting one removes them all
# first, so that no file of the earlier model (a stale index, a .bin beside the new .safetensors, a
# slow-tokenizer file, its chat template) is read with the new one. Other files are the user's and stay.
MODEL_FILES = (
    SAFETENSORS,
    SAFETENSORS_INDEX,
    TORCH_BIN,
    TORCH_BIN_INDEX,
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "README.md",
)
# Shards as transformers names them (model-00001-of-00002.safetensors), read through an index.
SHARD = re.compile(r"(model|pytorch_model)-\d+-of-\d+\.(safetensors|bin)")


def read_json(path: Path | str) -> dict:
    """A JSON object file (config.json, an index, tokenizer_config.json)."""
    with open(path) as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, found a {type(data).__name__}")
    return data


def write_json(path: Path | str, data: dict) -> None:
    """`data` as an exported folder's JSON files show it (floats through `json_floats`)."""
    with open(path, "w") as f:
        json.dump(json_floats(data), f, indent=2, sort_keys=True)
        f.write("\n")


def json_floats(value: Any) -> Any:
    """`value` with every float that is exactly a float32 written as the shortest decimal that round-trips
    float32, as HF's configs show them: GGUF stores norm_eps 1e-5 as float32, 9.999999747378752e-06 in
    float64, which our ModelConfig keeps as read. Other floats (0.02, 1e-6 typed in Python) are unchanged."""
    if isinstance(value, dict):
        return {k: json_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_floats(v) for v in value]
    if isinstance(value, float) and float(np.float32(value)) == value:
        return float(str(np.float32(value)))
    return value


def torch_to_numpy(tensor) -> np.ndarray:
    """A CPU tensor as numpy; bfloat16 keeps its bits (numpy has no native bfloat16)."""
    import torch

    tensor = tensor.detach().cpu().contiguous()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def numpy_to_torch(array: np.ndarray):
    import torch

    # torch.from_numpy shares memory and warns on read-only arrays (numpy views of jax arrays).
    array = np.array(array, order="C", copy=not array.flags.writeable or None)
    if array.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def one_line(error: BaseException) -> str:
    """An exception's message with its line breaks and indentation collapsed: error output is one line."""
    return " ".join(str(error).split())


def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return {key: torch_to_numpy(f.get_tensor(key)) for key in f.keys()}
    except SafetensorError as e:
        raise ValueError(f"{path}: not a readable safetensors file ({one_line(e)})") from None


def _check_safetensors(path: Path) -> None:
    """Refuse a truncated or corrupt safetensors file from its header alone: an 8-byte little-endian length,
    that many bytes of JSON whose tensors' data_offsets end where the file does."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        length = int.from_bytes(prefix, "little")
        if len(prefix) < 8 or 8 + length > size:
            raise ValueError(
                f"{path}: truncated or not a safetensors file: {size} bytes, shorter than its header says"
            )
        try:
            header = json.loads(f.read(length))
            needed = max(
                (int(entry["data_offsets"][1]) for name, entry in header.items() if name != "__metadata__"),
                default=0,
            )
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as e:
            raise ValueError(f"{path}: not a safetensors file (its header does not parse: {e!r})") from None
    found = size - 8 - length
    if found != needed:
        problem = "truncated" if found < needed else "corrupt"
        raise ValueError(f"{path}: {problem}: header says {needed} bytes of tensor data, file has {found}")


def torch_state(path: Path, *, mmap: bool = False) -> Mapping:
    """A .bin file's {name: tensor} dict, unpickled with weights_only=True so that a pickle holding anything
    else is refused, never run. With `mmap`, the tensors' data is not read."""
    import pickle
    import warnings

    import torch

    try:
        with warnings.catch_warnings():  # an old pickle protocol draws a warning the refusal below makes moot
            warnings.filterwarnings("ignore", "Detected pickle protocol")
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        # torch wraps the unpickler's one-line reason (its __context__) in paragraphs of advice.
        raise ValueError(
            f"{path}: refusing to load this .bin file: it is not a plain tensor state dict and unpickling it "
            f"would run arbitrary code (torch.load weights_only=True: {one_line(e.__context__ or e)}). "
            "Convert it to safetensors in a trusted environment first."
        ) from None
    except (RuntimeError, EOFError, AttributeError, TypeError) as e:
        raise ValueError(f"{path}: not a readable PyTorch weights file ({one_line(e)})") from None
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{path}: expected a flat {{name: tensor}} state dict, got {type(state).__name__}")
    return state


def _read_weights(path: Path) -> dict[str, np.ndarray]:
    if path.suffix == ".safetensors":
        return _read_safetensors(path)
    return {key: torch_to_numpy(value) for key, value in torch_state(path).items()}


def _weight_map(index: Path) -> dict[str, str]:
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"{index}: missing or empty 'weight_map'")
    return weight_map


def _weight_files(folder: Path) -> tuple[list[Path], Path | None]:
    """The weight files of a checkpoint folder, whichever of the supported layouts it uses, and the index
    that lists them (None for a single file)."""
    for index_name, single in ((SAFETENSORS_INDEX, SAFETENSORS), (TORCH_BIN_INDEX, TORCH_BIN)):
        index = folder / index_name
        if index.exists():
            return [folder / shard for shard in sorted(set(_weight_map(index).values()))], index
        if (folder / single).exists():
            return [folder / single], None
    present = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else "not a directory"
    raise ValueError(
        f"{folder}: no weights found (looked for {SAFETENSORS}, {SAFETENSORS_INDEX}, {TORCH_BIN}, "
        f"{TORCH_BIN_INDEX}); contents: {present}"
    )


def check_weight_files(folder: Path | str) -> None:
    """Refuse, without reading the tensors, a folder whose weights would fail to load: a missing shard, a
    safetensors file cut short (an interrupted download or copy), a .bin file that is not plain tensors."""
    files, index = _weight_files(Path(folder))
    for path in files:
        if not path.is_file():
            raise ValueError(f"{index}: lists {path.name}, which is missing")
        if path.suffix == ".safetensors":
            _check_safetensors(path)
        else:  # torch can map only the zip format; older .bin files are read whole
            torch_state(path, mmap=zipfile.is_zipfile(path))


def read_state_dict(folder: Path | str) -> dict[str, np.ndarray]:
    """All tensors of a checkpoint folder, whichever of the supported file layouts it uses."""
    files, index = _weight_files(Path(folder))
    state: dict[str, np.ndarray] = {}
    for path in files:
        state.update(_read_weights(path))
    if index is not None:
        listed, found = set(_weight_map(index)), set(state)
        if listed != found:
            raise ValueError(
                f"{index}: the index and the shards disagree; listed but absent: "
                f"{sorted(listed - found)}; present but unlisted: {sorted(found - listed)}"
            )
    return state


def write_state_dict(folder: Path | str, state: Mapping[str, np.ndarray]) -> None:
    """One model.safetensors with the `format: pt` metadata transformers requires, with the mode of the
    folder's other files (safetensors writes its file 0o600)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(
        {key: numpy_to_torch(value) for key, value in state.items()},
        str(folder / SAFETENSORS),
        metadata={"format": "pt"},
    )
    os.chmod(folder / SAFETENSORS, new_file_mode())


def new_file_mode() -> int:
    """The mode `open(path, "w")` gives a new file: 0o666 less the process's umask (0o644 under the usual
    0o022)."""
    umask = os.umask(0o022)  # reading the umask means setting it; put it back at once
    os.umask(umask)
    return 0o666 & ~umask


def check_export_target(path: Path | str, *, overwrite: bool = False) -> None:
    """Refuse, before anything is converted, an export target that is a file, or a folder with anything in
    it unless `overwrite` (then the writer clears it with `clear_model_files`). Every export checks here:
    save_hf, save_t2mlr_torch, save_params and tools/convert_checkpoint.py."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{path} exists and is not a folder: choose a folder to export into")
    if not overwrite and path.is_dir() and any(path.iterdir()):
        raise ValueError(
            f"{path} is not empty: choose a new folder, or pass --overwrite (overwrite=True) to replace the "
            "model in it"
        )


def stale_model_files(folder: Path | str) -> list[Path]:
    """The files of `folder` that a reader of a model exported into it would read: MODEL_FILES, the
    shards an index lists and any file named as a shard."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    names = {
        p.name for p in folder.iterdir() if p.is_file() and (p.name in MODEL_FILES or SHARD.fullmatch(p.name))
    }
    for index in (SAFETENSORS_INDEX, TORCH_BIN_INDEX):
        try:
            listed = [name for name in _weight_map(folder / index).values() if isinstance(name, str)]
        except (OSError, ValueError, AttributeError):  # absent, or as broken as the rest of the old model
            continue
        names |= {name for name in listed if Path(name).name == name and (folder / name).is_file()}
    return sorted(folder / name for name in names)


def clear_model_files(folder: Path | str) -> None:
    """Remove `stale_model_files` (what an export writes, and what else of an earlier model would be read
    with it); other files stay."""
    for path in stale_model_files(folder):
        path.unlink()


@contextmanager
def staged_folder(target: Path | str):
    """A sibling folder to write an export into, put in `target`'s place only once the block completes: a
    kill leaves `target` absent, as it was, or the whole new export, never half of one. An existing target
    (an --overwrite) is copied in first, so that the writer replaces its model there as it would in place.
    A stage left by an export cut short is removed; a target a kill left set aside mid-swap is put back."""
    target = Path(target).absolute()
    stage, replaced = (
        target.with_name(f".{target.name}.partial"),
        target.with_name(f".{target.name}.replaced"),
    )
    if replaced.exists():  # killed between the swap's two renames: the old target is whole
        if target.exists():
            shutil.rmtree(replaced)
        else:
            replaced.rename(target)
    if stage.exists():
        shutil.rmtree(stage)
    if target.is_dir():
        shutil.copytree(target, stage, symlinks=True)
    else:
        stage.mkdir(parents=True)
    try:
        yield stage
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    if target.exists():
        target.rename(replaced)
    stage.rename(target)
    if replaced.exists():
        shutil.rmtree(replaced)
