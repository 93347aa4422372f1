"""The CPU runtime (t2mlr_jax.cpu_runtime): an entry point's `tune()` adds the XLA:CPU flags and has glibc
malloc keep freed memory, when the CPU is the backend to expect; importing the package touches neither.
Settings the user made win over both."""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from t2mlr_jax import cpu_runtime
from t2mlr_jax.cpu_runtime import COMPILED, CPU_FLAGS, MALLOPT

ROOT = Path(__file__).resolve().parents[1]
OURS = [f"--{name}={value}" for name, value in CPU_FLAGS.items()]
USERS = "--xla_force_host_platform_device_count=2"
# Programs run under the release's Python, which import nothing of ours (experiments/__init__.py).
RELEASE_SIDE = {
    "experiments/make_karpathy_nanochat_fixture.py",
    "experiments/make_nanochat_fixture.py",
    "experiments/make_ponderlm2_fixture.py",
    "experiments/make_release_fixture.py",
    "experiments/release_args.py",
    "experiments/benchmarks/vs_lrt_torch.py",
    "experiments/benchmarks/vs_ponderlm2_torch.py",
    "experiments/benchmarks/vs_release_torch.py",
}


@pytest.mark.parametrize(
    "platforms, device_file, expected",
    [
        (None, None, True),
        (None, "vfio/vfio", True),  # the VFIO control file alone: no device behind it
        (None, "accel0", False),  # a TPU VM
        (None, "vfio/0", False),  # a TPU VM (v5e, v6e)
        (None, "nvidia0", False),
        ("", "nvidia0", False),
        ("cpu", "accel0", True),
        ("tpu", None, False),
        ("cuda,cpu", None, False),
    ],
)
def test_the_cpu_backend_is_expected_from_jax_platforms_else_from_device_files(
    monkeypatch, tmp_path, platforms, device_file, expected
):
    if device_file:
        (tmp_path / device_file).parent.mkdir(exist_ok=True)
        (tmp_path / device_file).touch()
    monkeypatch.setattr(cpu_runtime, "DEVICES", str(tmp_path))
    if platforms is None:
        monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    else:
        monkeypatch.setenv("JAX_PLATFORMS", platforms)
    assert cpu_runtime.cpu_backend_expected() is expected


class FakeLibc:
    def __init__(self):
        self.mallopt_calls, self.trims = [], 0

    def mallopt(self, param, value):
        self.mallopt_calls.append((param, value))

    def malloc_trim(self, pad):
        self.trims += 1


@pytest.mark.parametrize("cpu", [True, False])
def test_tune_sets_flags_and_malloc_only_when_the_cpu_is_expected(monkeypatch, cpu):
    libc, listeners = FakeLibc(), []
    monkeypatch.setattr(cpu_runtime, "cpu_backend_expected", lambda: cpu)
    monkeypatch.setattr(cpu_runtime, "_glibc", lambda: libc)
    monkeypatch.setattr(cpu_runtime.jax.monitoring, "register_event_duration_secs_listener", listeners.append)
    monkeypatch.setenv("XLA_FLAGS", USERS)
    cpu_runtime.tune()
    if not cpu:
        assert (os.environ["XLA_FLAGS"], libc.mallopt_calls, listeners) == (USERS, [], [])
        return
    assert os.environ["XLA_FLAGS"].split() == [USERS, *OURS]
    assert libc.mallopt_calls == list(MALLOPT.items())
    (listener,) = listeners
    listener(COMPILED, 0.1)  # a small program's compilation: its scratch is not worth a trim
    listener("/jax/other", 5.0)
    assert libc.trims == 0
    listener(COMPILED, 5.0)
    assert libc.trims == 1


def test_the_users_own_flags_win(monkeypatch):
    mine = " ".join(f"--{name}=false" for name in CPU_FLAGS)
    monkeypatch.setenv("XLA_FLAGS", mine)
    cpu_runtime.add_xla_flags()
    assert os.environ["XLA_FLAGS"] == mine


@pytest.mark.parametrize("variable", ["MALLOC_ARENA_MAX=8", "GLIBC_TUNABLES=glibc.malloc.arena_max=8"])
def test_a_users_malloc_setting_leaves_malloc_alone(monkeypatch, variable):
    for name in [name for name in os.environ if name.startswith("MALLOC_")] + ["GLIBC_TUNABLES"]:
        monkeypatch.delenv(name, raising=False)
    assert cpu_runtime._glibc() is not None  # Linux with glibc, where the tests run
    monkeypatch.setenv(*variable.split("=", 1))
    assert cpu_runtime._glibc() is None


def main_block(tree: ast.Module) -> list[ast.stmt]:
    """The statements of a module's `if __name__ == "__main__":` (none when it has no such block)."""
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'":
            return node.body
    return []


def programs() -> list[str]:
    """Every file of the repo run as a program: main.py, tools/*.py and the experiments with a `__main__`."""
    files = [ROOT / "main.py", *(ROOT / "tools").glob("*.py"), *(ROOT / "experiments").rglob("*.py")]
    return sorted(str(path.relative_to(ROOT)) for path in files if main_block(ast.parse(path.read_text())))


@pytest.mark.parametrize("program", programs())
def test_every_program_of_ours_tunes_first_and_the_releases_never(program):
    source = (ROOT / program).read_text()
    if program in RELEASE_SIDE:
        assert "cpu_runtime" not in source
    else:  # first: its other statements may start a backend (imports do not: test_no_entry_point_...)
        assert ast.unparse(_tuned_part(main_block(ast.parse(source)))[0]) == "cpu_runtime.tune()"


def _tuned_part(block: list[ast.stmt]) -> list[ast.stmt]:
    """main.py runs inside the lock of the workdir its command line names, taken before anything heavy
    (JAX included) is imported: the lock's body, its imports aside, is the block."""
    first = block[0]
    if isinstance(first, ast.With) and ast.unparse(first.items[0].context_expr).startswith(
        "_named_workdir_lock"
    ):
        return [s for s in first.body if not isinstance(s, ast.ImportFrom)]
    return block


def test_the_release_side_list_names_programs():
    assert RELEASE_SIDE <= set(programs())


def run_python(code: str, **env: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | env
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


# Whether malloc still serves a large block from a fresh mmap (glibc's default; MALLOPT's M_MMAP_MAX = 0
# serves it from the heap), read off mallinfo2's bytes in mmapped blocks.
MMAPPED = """
import ctypes, json, os
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype, libc.malloc.restype = Info, ctypes.c_void_p
def mmapped():
    before = libc.mallinfo2().hblkhd
    block = libc.malloc(64 << 20)
    grown = libc.mallinfo2().hblkhd - before
    libc.free(ctypes.c_void_p(block))
    return grown >= 64 << 20
def state():
    return {"flags": os.environ["XLA_FLAGS"], "mmapped": mmapped()}
"""


@pytest.mark.slow
def test_importing_the_package_tunes_nothing_and_tune_does():
    code = MMAPPED + (
        "import t2mlr_jax, t2mlr_jax.experiment, t2mlr_jax.train.trainer\n"
        "imported = state()\n"
        "t2mlr_jax.cpu_runtime.tune()\n"
        "print(json.dumps([imported, state()]))"
    )
    imported, tuned = json.loads(run_python(code, XLA_FLAGS=USERS, JAX_PLATFORMS="cpu"))
    assert imported == {"flags": USERS, "mmapped": True}
    assert tuned == {"flags": " ".join([USERS, *OURS]), "mmapped": False}


@pytest.mark.slow
@pytest.mark.parametrize("program", ["main.py", "tools/report.py"])
def test_a_program_is_tuned_before_it_parses_its_arguments(program):
    code = MMAPPED + (
        f"import runpy, sys; sys.argv = [{program!r}, '--help']\n"
        f"try:\n    runpy.run_path({program!r}, run_name='__main__')\n"
        "except SystemExit:\n    print(json.dumps(state()))"
    )
    out = json.loads(run_python(code, XLA_FLAGS=USERS, JAX_PLATFORMS="cpu").splitlines()[-1])
    assert out == {"flags": " ".join([USERS, *OURS]), "mmapped": False}


@pytest.mark.slow
def test_no_entry_point_starts_a_backend_on_import():
    """So that tune(), first in `__main__`, runs before the backend reads XLA_FLAGS."""
    ours = [program for program in programs() if program not in RELEASE_SIDE]
    code = (
        "import importlib, runpy; import jax._src.xla_bridge as xb; from absl import flags\n"
        f"for program in {ours!r}:\n"
        "    known = set(flags.FLAGS)\n"
        "    if program.startswith('tools/'):  # scripts, not modules\n"
        "        runpy.run_path(program, run_name='imported')\n"
        "    else:\n"
        "        importlib.import_module(program.removesuffix('.py').replace('/', '.'))\n"
        "    assert not xb._backends, program\n"
        "    for name in set(flags.FLAGS) - known:  # main.py and tools/aot_compile.py both define --config\n"
        "        delattr(flags.FLAGS, name)\n"
        "print('ok')"
    )
    assert run_python(code) == "ok"


# Page faults of the last 6 of 12 calls of a program with two 16 MiB temporaries (sin x, cos x): each call
# handed fresh pages faults both in again (12 temporaries' worth); kept pages fault now and then (a
# temporary placed where the heap has just grown).
FAULTS = """
import resource, jax, jax.numpy as jnp
from t2mlr_jax import cpu_runtime
cpu_runtime.tune()
f = jax.jit(lambda x: (jnp.sin(x) @ jnp.cos(x)).sum())
x = jnp.ones((2048, 2048))
for _ in range(6):
    f(x).block_until_ready()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(6):
    f(x).block_until_ready()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
TEMP_PAGES = 2048 * 2048 * 4 // 4096


@pytest.mark.slow
def test_temporaries_reuse_their_pages_unless_the_user_configured_malloc():
    assert int(run_python(FAULTS)) < 6 * TEMP_PAGES  # measured: 0 to 2
    assert int(run_python(FAULTS, MALLOC_ARENA_MAX="8")) > 10 * TEMP_PAGES  # measured: 12


@pytest.mark.slow
def test_a_program_on_a_machine_without_a_tpu_prints_nothing_of_libtpu(monkeypatch):
    """With the test extra's libtpu installed and JAX_PLATFORMS unset (as a user runs it), main.py on this
    TPU-less machine starts the CPU alone: its stderr is its own one error line, nothing from libtpu."""
    monkeypatch.delenv("JAX_PLATFORMS")
    assert cpu_runtime.cpu_backend_expected(), "the suite runs on a machine without an accelerator"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPU_", "ALLOW_MULTIPLE_LIBTPU"))}
    done = subprocess.run(
        [sys.executable, "main.py", "--config=configs/smollm135m_t2mlr.py"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    (line,) = done.stderr.splitlines()
    assert line.startswith("error: data.train_path is empty"), line
