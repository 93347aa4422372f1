"""Editing a config at the edge (config files, presets, the command line): dotted paths, presets, and
config files loaded by path."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

from ml_collections import config_dict

from t2mlr_jax.config.convert import FREE_FORM
from t2mlr_jax.registry import did_you_mean


def config_module(path: str | os.PathLike):
    """A config file (configs/<name>.py) as a module: its get_config and constants, loaded by path as
    --config= names it (a fresh module each time); only the shared recipes are imported as configs.recipes."""
    path = Path(path)
    spec = importlib.util.spec_from_file_location(f"configs.{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def apply_preset(
    config: config_dict.ConfigDict, arg: str | None, presets: dict[str, dict]
) -> config_dict.ConfigDict:
    """`get_config(arg)`: arg is a comma list of preset names applied in order (e.g. "cpu" or "baseline,cpu").

    A preset maps dotted paths to values, e.g. {"arch": "transformer", "model.recurrence.l_start": 12}.
    """
    for name in filter(None, (arg or "").split(",")):
        if name not in presets:
            raise ValueError(
                f"unknown preset {name!r}{did_you_mean(name, presets)}; choose from {sorted(presets)}"
            )
        for path, value in presets[name].items():
            set_path(config, path, value)
    return config


def dotted_keys(config: config_dict.ConfigDict, prefix: str = "") -> list[str]:
    """Every field of a config as a dotted path ("data.train_path", ...), what --config.<path> accepts."""
    keys = []
    for key, value in config.items():
        keys.append(prefix + key)
        if isinstance(value, config_dict.ConfigDict):
            keys += dotted_keys(value, f"{prefix}{key}.")
    return keys


def set_path(config: config_dict.ConfigDict, path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    node = config
    for key in parents:
        node = node[key]
    if leaf not in node and not (len(parents) == 2 and parents[0] == "data" and parents[1] in FREE_FORM):
        raise KeyError(f"{path} is not a config field{did_you_mean(path, dotted_keys(config))}")
    node[leaf] = value


def update_known(section: config_dict.ConfigDict, values: dict, where: str) -> None:
    """Update existing keys only: a typo in a config file is an error, not a silently new field."""
    for key, value in values.items():
        if key not in section:
            raise KeyError(
                f"{where}.{key} is not a config field{did_you_mean(key, section.keys())}; "
                f"known: {sorted(section.keys())}"
            )
        if isinstance(section[key], config_dict.ConfigDict) and key not in FREE_FORM:
            update_known(section[key], value, f"{where}.{key}")
        else:
            section[key] = value
