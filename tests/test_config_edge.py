"""One config form below the edge: a config file's ml_collections ConfigDict is turned into the typed
`Experiment` once (t2mlr_jax.config, t2mlr_jax.experiment's resolve, called by main.py, the tools and the
studies), and nothing else in the package sees a ConfigDict. Checked on the source, as
tests/test_layering.py checks the floors."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "t2mlr_jax"
# The package's parts that read and write ConfigDicts: the conversion, the assembly, and the studies (programs
# like main.py, on the floor above the assembly, that edit a config file's ConfigDict and resolve it).
EDGE = ("config", "experiment.py", "studies")
TYPED = ("train", "architectures")  # the trainer and the architectures: handed the typed Experiment only
CONVERSIONS = {"from_config_dict", "to_config_dict"}


def _below_the_edge() -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py")) if p.relative_to(PACKAGE).parts[0] not in EDGE]


def _imports(tree: ast.AST) -> list[tuple[str, str]]:
    """(module, name) of every import; name "" for `import module`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, "") for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found += [(node.module, alias.name) for alias in node.names]
    return found


def test_only_the_edge_imports_ml_collections_or_converts_a_config_dict():
    offenders = [
        f"{path.relative_to(PACKAGE)} imports {module}{'.' + name if name else ''}"
        for path in _below_the_edge()
        for module, name in _imports(ast.parse(path.read_text()))
        if module.split(".")[0] == "ml_collections" or name in CONVERSIONS
    ]
    assert offenders == []


def test_the_trainer_and_the_architectures_take_the_typed_experiment():
    """Every `config` parameter of their functions is annotated Experiment (checked at run time by the
    tests' beartype hook, tests/conftest.py)."""
    untyped = []
    for floor in TYPED:
        for path in sorted((PACKAGE / floor).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    args = node.args
                    for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs):
                        if arg.arg == "config" and (
                            arg.annotation is None or ast.unparse(arg.annotation) != "Experiment"
                        ):
                            untyped.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}")
    assert untyped == []
