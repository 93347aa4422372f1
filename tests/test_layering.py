"""The package's floors, checked on the source: a floor imports only the floors below it, whether by an
import statement (at the top or inside a function) or by a string naming a module (importlib, registered
entries). Imports are absolute, so that every one can be read off the source."""

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "t2mlr_jax"
# Bottom to top: each floor may import the ones before it. The package's own __init__ runs before any of
# its modules, so it belongs to the bottom floor.
FLOORS = (
    "cpu_runtime",
    "registry",
    "parallel",
    "model",
    "data",
    "config",
    "storage",
    "formats",  # the checkpoint formats' machinery and registry, which the systems' release layouts extend
    "architectures",
    "interop",
    "train",
    "analysis",
    "experiment",  # the assembly of a config file's experiment: every registered section
    "studies",  # the paper's studies, the benchmarks and the release parity harness, the top floor
)
# A string naming a module: "t2mlr_jax.a.b", "t2mlr_jax.a.b:f", or the start of f"t2mlr_jax.a.{name}".
MODULE_STRING = re.compile(r"t2mlr_jax(\.\w+)+[.:\w]*")


def floor_of(path: Path, package: Path = PACKAGE) -> str:
    part = path.relative_to(package).parts[0].removesuffix(".py")
    return FLOORS[0] if part == "__init__" else part


def floor_named(module: str) -> str | None:
    """The floor of an imported t2mlr_jax module (the package itself: the bottom one); None for a relative
    import."""
    parts = re.split(r"[.:]", module)
    if parts[0] != "t2mlr_jax":
        return None
    return parts[1] if len(parts) > 1 else FLOORS[0]


def imported(source: str) -> set[str]:
    """The t2mlr_jax modules a source names ("t2mlr_jax.x.y", `from t2mlr_jax import x` as "t2mlr_jax.x"),
    and "relative import" for an import written relative to its package."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level:
            names.add("relative import")
        elif isinstance(node, ast.ImportFrom) and node.module == "t2mlr_jax":
            names.update(f"t2mlr_jax.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add(node.module)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if MODULE_STRING.fullmatch(node.value):
                names.add(node.value)
    return {name for name in names if name.split(".")[0] in ("t2mlr_jax", "relative import")}


def upward_imports(floor: str, source: str) -> list[str]:
    """What a source file of `floor` imports from the floors above it (or from no floor)."""
    below = FLOORS[: FLOORS.index(floor) + 1]
    return sorted(name for name in imported(source) if floor_named(name) not in below)


def violations(package: Path = PACKAGE) -> list[str]:
    return [
        f"{path.relative_to(package)} imports {name}"
        for path in sorted(package.rglob("*.py"))
        for name in upward_imports(floor_of(path, package), path.read_text())
    ]


def test_every_floor_is_ranked_and_exists():
    assert {floor_of(path) for path in PACKAGE.rglob("*.py")} == set(FLOORS)


def test_no_floor_imports_one_above_it():
    assert violations() == []


def test_the_package_root_imports_only_the_bottom_floor():
    assert upward_imports(FLOORS[0], "import t2mlr_jax\nfrom t2mlr_jax import cpu_runtime") == []
    assert upward_imports(FLOORS[0], "from t2mlr_jax import registry") == ["t2mlr_jax.registry"]


@pytest.mark.parametrize(
    "planted",
    [
        "from t2mlr_jax.train import trainer",
        "import t2mlr_jax.train.trainer",
        "from t2mlr_jax import train",
        "def f():\n    from t2mlr_jax.train.trainer import train",
        "import importlib\nimportlib.import_module('t2mlr_jax.train.trainer')",
        "ENTRY = 't2mlr_jax.train.trainer:train'",
        "def f(x):\n    return importlib.import_module(f't2mlr_jax.train.{x}')",
        "from .train import trainer",
    ],
)
def test_a_planted_upward_import_is_caught(tmp_path, planted):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "fine.py").write_text(
        "from t2mlr_jax.model import layers\nimport t2mlr_jax.registry\n"
    )
    (tmp_path / "model" / "planted.py").write_text(planted + "\n")
    found = violations(tmp_path)
    assert len(found) == 1 and found[0].startswith("model/planted.py imports"), found


def test_imports_of_the_floor_itself_and_below_and_docstrings_pass():
    source = '"""See t2mlr_jax.train.trainer for the loop."""\nfrom t2mlr_jax.model import backbone\n'
    assert upward_imports("model", source + "from t2mlr_jax.parallel import rules") == []


# Each research system is one package of t2mlr_jax/architectures/; what it exports from its __init__ is its
# interface. Below the studies floor, nothing outside a system reaches into its modules; a study, a benchmark
# or the parity harness may, to measure or check a system's internals.
SYSTEMS = sorted(p.name for p in (PACKAGE / "architectures").iterdir() if (p / "__init__.py").exists())
STUDY_FLOORS = FLOORS[FLOORS.index("studies") :]


def reached_internals(package: Path = PACKAGE) -> list[str]:
    found = []
    for path in sorted(package.rglob("*.py")):
        own = path.relative_to(package).parts[:2]
        if floor_of(path, package) in STUDY_FLOORS:
            continue
        for name in imported(path.read_text()):
            parts = re.split(r"[.:]", name)
            if parts[1:2] == ["architectures"] and len(parts) > 3 and parts[2] in SYSTEMS:
                if tuple(parts[1:3]) != own:
                    found.append(f"{path.relative_to(package)} imports {name}")
    return found


def test_the_systems_are_packages():
    assert set(SYSTEMS) >= {"t2mlr", "lrt", "ponderlm2", "recirculation", "baselines"}


def test_no_system_interop_or_trainer_reaches_into_another_systems_modules():
    assert reached_internals() == []


def test_a_planted_reach_into_a_system_is_caught(tmp_path):
    (tmp_path / "architectures" / "lrt").mkdir(parents=True)
    (tmp_path / "interop").mkdir()
    (tmp_path / "architectures" / "lrt" / "architecture.py").write_text(
        "from t2mlr_jax.architectures.lrt.forward import LRTConfig\n"
    )
    (tmp_path / "interop" / "planted.py").write_text(
        "from t2mlr_jax.architectures.lrt import LRTConfig\n"
        "from t2mlr_jax.architectures.lrt.forward import x\n"
    )
    assert reached_internals(tmp_path) == ["interop/planted.py imports t2mlr_jax.architectures.lrt.forward"]
