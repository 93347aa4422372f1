"""FORMATS: every checkpoint format we read or write, by name, as `CheckpointFormat` entries.

A format registers itself from the module that implements it: the generic ones from this package (hf,
gguf, nanochat; `import_formats` finds them), a research system's release layout from its package
(t2mlr-torch: architectures/t2mlr, ponderlm2: architectures/ponderlm2, both registered when the systems are
found), our orbax checkpoints from t2mlr_jax.interop. Readers of the registry (t2mlr_jax.interop.pretrained,
tools/convert_checkpoint.py) import all of them first.

Recognition tries the formats by ascending `priority` (then name): a layout that is also another's (the
T²MLR and PonderLM-2 release folders are HF folders too) ranks before it, HF's catch-all "a folder with a
config.json" last (`CATCH_ALL`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import pkgutil
from collections.abc import Callable
from pathlib import Path

from t2mlr_jax.formats.files import check_weight_files, one_line, read_json
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.registry import Registry

FIRST, RELEASE, CATCH_ALL = 0, 50, 100  # priorities: a file type or our own, a release layout, HF's folder


@dataclasses.dataclass(frozen=True)
class CheckpointFormat:
    name: str
    recognises: Callable[[Path], bool]
    # (path, *, param_dtype) -> the ModelConfig `load` gives, read without the weights but with their headers
    # checked: a checkpoint that would fail to load is refused now (one ValueError naming the file)
    read_config: Callable[..., ModelConfig]
    load: Callable[..., tuple[ModelConfig, dict]]  # (path, *, param_dtype, progress) -> (cfg, params)
    # (cfg, params, path, *, tokenizer, progress, overwrite, **{option: value}), None: import only
    save: Callable[..., None] | None = None
    options: tuple[str, ...] = ()  # the settings `save` takes besides those (convert_checkpoint's --<option>)
    # why an export cannot hold this model, or None: "{source} is <reason>"
    refuses_model: Callable[[ModelConfig], str | None] = lambda cfg: None
    # why the checkpoint at a path cannot become an orbax model checkpoint, or None: "{source} is <reason>"
    refuses_checkpoint: Callable[[Path], str | None] = lambda path: None
    backbone_only: bool = False  # holds a plain backbone: --drop-recurrence exports a T²MLR model's
    # --verify's PyTorch side: path -> a torch module, tokens -> logits (or an output with .logits)
    torch_model: Callable[[Path], Callable] | None = None
    # where our side of --verify is not the model's own forward (PonderLM-2's evaluation with the settings
    # its folder records): path -> ((cfg, params, tokens) -> logits); its report's mode is the format's name
    evaluation: Callable[[Path], Callable] | None = None
    import_note: Callable[[Path], str] | None = None  # a line an import prints: what the orbax side omits
    priority: int = RELEASE
    described: str | None = None  # how the "not a checkpoint" error names it (None: told apart by contents)


FORMATS = Registry("checkpoint format")


def register_format(entry: CheckpointFormat) -> None:
    """`entry` under its own name."""
    FORMATS.register(entry.name, entry)


def import_formats() -> Registry:
    """FORMATS with this package's formats registered: every module here but this one and the PyTorch
    references (*_torch: torch loads only for --verify). The systems' and orbax: see the module docstring."""
    package = importlib.import_module("t2mlr_jax.formats")
    for module in pkgutil.iter_modules(package.__path__):
        if module.name != "registry" and not module.name.endswith("_torch"):
            importlib.import_module(f"t2mlr_jax.formats.{module.name}")
    return FORMATS


def in_order() -> list[CheckpointFormat]:
    return sorted((entry for _, entry in FORMATS.items()), key=lambda f: (f.priority, f.name))


def recognise(path: Path | str) -> CheckpointFormat:
    """The first registered format (by priority) whose checkpoints `path` looks like."""
    path = Path(path)
    for entry in in_order():
        if entry.recognises(path):
            return entry
    named = [entry.described for entry in in_order() if entry.described]
    raise ValueError(f"{path}: not {', '.join(named[:-1])} or {named[-1]}")


@contextlib.contextmanager
def naming(source: Path | str):
    """A config that does not convert is refused naming its file (a KeyError is a field it lacks)."""
    try:
        yield
    except KeyError as e:
        raise ValueError(f"{source}: no {e} field") from None
    except (ValueError, TypeError) as e:  # one line: some list their problems one per line
        raise ValueError(f"{source}: {one_line(e)}") from None


def folder_config(
    from_json: Callable[..., ModelConfig], path: Path | str, *, param_dtype: str = "float32"
) -> ModelConfig:
    """The ModelConfig of an HF-style folder (config.json beside its weights) as `from_json` reads its
    config.json, after its weight files' headers are checked."""
    check_weight_files(path)
    config_file = Path(path) / "config.json"
    config = read_json(config_file)
    with naming(config_file):
        return from_json(config, param_dtype=param_dtype)


def holds_no_recurrence(name: str) -> Callable[[ModelConfig], str | None]:
    """The refusal of an export whose format holds a plain backbone alone."""

    def refuses(cfg: ModelConfig) -> str | None:
        if cfg.recurrence is None:
            return None
        return (
            f"a T²MLR model and --to {name} cannot hold its recurrence: pass --drop-recurrence to export "
            "the backbone alone, or use --to t2mlr-torch"
        )

    return refuses
