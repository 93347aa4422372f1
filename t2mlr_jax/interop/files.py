"""Reading and writing PyTorch-style weight files as numpy state dicts (no JAX here).

Weights travel as `{key: np.ndarray}` in the checkpoint's own dtype (bfloat16 via ml_dtypes), so
every layout's conversion is plain numpy and the PyTorch reference can reuse these readers.
Supported: model.safetensors, sharded safetensors (model.safetensors.index.json), and
pytorch_model.bin (single or sharded), which is only unpickled with `weights_only=True`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_BIN = "pytorch_model.bin"
TORCH_BIN_INDEX = "pytorch_model.bin.index.json"


def read_json(path: Path | str) -> dict:
    with open(path) as f:
        return json.load(f)


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


def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return {key: torch_to_numpy(f.get_tensor(key)) for key in f.keys()}


def _read_torch_bin(path: Path) -> dict[str, np.ndarray]:
    import pickle

    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, AttributeError, TypeError) as e:
        raise ValueError(
            f"{path}: refusing to load this .bin file: it is not a plain tensor state dict and unpickling it "
            f"would run arbitrary code (torch.load weights_only=True failed: {e}). Convert it to safetensors "
            f"in a trusted environment first."
        ) from e
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{path}: expected a flat {{name: tensor}} state dict, got {type(state).__name__}")
    return {key: torch_to_numpy(value) for key, value in state.items()}


def _read_sharded(folder: Path, index_name: str, read_one) -> dict[str, np.ndarray]:
    weight_map = read_json(folder / index_name).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"{folder / index_name}: missing or empty 'weight_map'")
    state: dict[str, np.ndarray] = {}
    for shard in sorted(set(weight_map.values())):
        state.update(read_one(folder / shard))
    listed, found = set(weight_map), set(state)
    if listed != found:
        raise ValueError(
            f"{folder / index_name}: the index and the shards disagree; listed but absent: "
            f"{sorted(listed - found)}; present but unlisted: {sorted(found - listed)}"
        )
    return state


def read_state_dict(folder: Path | str) -> dict[str, np.ndarray]:
    """All tensors of a checkpoint folder, whichever of the supported file layouts it uses."""
    folder = Path(folder)
    if (folder / SAFETENSORS_INDEX).exists():
        return _read_sharded(folder, SAFETENSORS_INDEX, _read_safetensors)
    if (folder / SAFETENSORS).exists():
        return _read_safetensors(folder / SAFETENSORS)
    if (folder / TORCH_BIN_INDEX).exists():
        return _read_sharded(folder, TORCH_BIN_INDEX, _read_torch_bin)
    if (folder / TORCH_BIN).exists():
        return _read_torch_bin(folder / TORCH_BIN)
    present = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else "not a directory"
    raise ValueError(
        f"{folder}: no weights found (looked for {SAFETENSORS}, {SAFETENSORS_INDEX}, {TORCH_BIN}, "
        f"{TORCH_BIN_INDEX}); contents: {present}"
    )


def write_state_dict(folder: Path | str, state: Mapping[str, np.ndarray]) -> None:
    """One model.safetensors with the `format: pt` metadata transformers requires."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(
        {key: numpy_to_torch(value) for key, value in state.items()},
        str(folder / SAFETENSORS),
        metadata={"format": "pt"},
    )
