"""The package's layers, checked on the source: the model knows nothing of training, data or interop, and
the parallel utilities know nothing of the model (they read logical axes, not parameter tables)."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "t2mlr_jax"
FORBIDDEN = {
    "model": ("t2mlr_jax.train", "t2mlr_jax.data", "t2mlr_jax.interop", "t2mlr_jax.architectures"),
    "parallel": ("t2mlr_jax.model", "t2mlr_jax.train", "t2mlr_jax.architectures"),
    "architectures": ("t2mlr_jax.train", "t2mlr_jax.interop"),
}


def imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_nothing_above_it(layer):
    files = sorted((PACKAGE / layer).rglob("*.py"))
    assert files
    wrong = {
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path in files
        for name in imports(path)
        if name.startswith(FORBIDDEN[layer])
    }
    assert not wrong, sorted(wrong)
