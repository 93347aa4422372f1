"""Every program's command line. One that reads an experiment config file (main.py, tools/aot_compile.py):
absl flags with `--config=configs/x.py[:preset]` and `--config.<section>.<field>=value` overrides, where
--help exits 0 and every bad flag, config file, preset or override is one error line (exit status 2); every
other (tools/, experiments/ and the studies behind them): a `OneLineParser`, argparse with that same one
line. `fail` is the line for every program. Stdlib only at import (absl is imported by `parse_flags`), so
that the release-side drivers (t2mlr_jax/studies/fixtures/) parse with it under the release's Python."""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path
from typing import NoReturn

HELP_FLAGS = ("-h", "-?", "--help", "--helpshort", "--helpfull")


def fail(error: Exception | str, status: int = 2) -> NoReturn:
    """One line on stderr (a message's own line breaks folded), no traceback; exit status 2 for bad input."""
    print("error: " + " ".join(str(error).split()), file=sys.stderr)
    sys.exit(status)


class OneLineParser(argparse.ArgumentParser):
    """argparse whose bad arguments are one `error:` line and exit status 2 (as main.py's flags); --help as
    argparse's, the description (a program's docstring) as written unless `formatter_class` says otherwise."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        fail(message)


def config_file_flag(default_config: str, help: str):
    """absl's `--config` flag (config_flags.DEFINE_config_file). Defining it loads the default config with
    the command line's --config.<field> overrides when no --config is given: a bad override there is the
    one error line too."""
    from ml_collections import config_flags

    try:
        return config_flags.DEFINE_config_file("config", default_config, help)
    except Exception as e:  # noqa: BLE001 -- as in parse_flags
        fail(config_problem(sys.argv, default_config) or e)


def parse_flags(argv: list[str], config_flag, default_config: str) -> list[str]:
    """absl's parse of `argv`, `config_flag` the program's config_flags.DEFINE_config_file holder and
    `default_config` its default (a file path with an optional :preset)."""
    from absl import app, flags

    if any(arg in HELP_FLAGS for arg in argv[1:]):
        app.usage(shorthelp="--helpfull" not in argv, writeto_stdout=True, exitcode=0)
    try:
        parsed = flags.FLAGS(argv)
        config_flag.value.keys()  # config_flags reports a config file that failed to load only when used
        return parsed
    except Exception as e:  # noqa: BLE001 -- whatever the config file raised, the user gets one line
        problem = config_problem(argv, default_config)  # a missing file or mistyped field, with nearest names
        if problem:
            fail(problem)
        cause = e
        while cause.__cause__ or cause.__context__:  # config_flags wraps the config file's own error
            cause = cause.__cause__ or cause.__context__
        line = _config_line(cause, _config_arg(argv, default_config)[0])
        if line:
            fail(f"{line}: {type(cause).__name__}: {cause.msg if isinstance(cause, SyntaxError) else cause}")
        where = str(e).split(": ", 1)[0] + ": " if str(e).startswith("flag --") and cause is not e else ""
        fail(where + " ".join(str(cause).split()))


def _config_arg(argv: list[str], default_config: str) -> tuple[Path, str]:
    """(the config file, its presets) that --config names, else the default's."""
    given = [a.split("=", 1)[1] for a in argv if a.startswith("--config=")]
    path, _, preset = (given[-1] if given else default_config).partition(":")
    return Path(path), preset


def _config_line(error: BaseException, path: Path) -> str | None:
    """'config file F, line N' where the config file itself raised `error` (its deepest frame there)."""
    target = path.resolve()
    if isinstance(error, SyntaxError) and error.filename and Path(error.filename).resolve() == target:
        return f"config file {path}, line {error.lineno}"
    lines = [
        n
        for frame, n in traceback.walk_tb(error.__traceback__)
        if Path(frame.f_code.co_filename).resolve() == target
    ]
    return f"config file {path}, line {lines[-1]}" if lines else None


def config_problem(argv: list[str], default_config: str) -> str | None:
    """A missing config file, or a --config.<field> override naming no field, with the nearest names."""
    from t2mlr_jax.config.edit import config_module, dotted_keys
    from t2mlr_jax.registry import did_you_mean

    path, preset = _config_arg(argv, default_config)
    if not path.is_file():
        known = [p.name for p in Path(default_config).parent.glob("*.py")]
        return f"config file {str(path)!r} does not exist{did_you_mean(path.name, known)}"
    overrides = [a[len("--config.") :].split("=", 1)[0] for a in argv if a.startswith("--config.")]
    if not overrides:
        return None
    try:
        keys = dotted_keys(config_module(path).get_config(preset or None))
    except Exception:  # noqa: BLE001 -- a config that fails to build is reported by the parse itself
        return None
    unknown = [name for name in overrides if name not in keys]
    if unknown:
        return f"--config.{unknown[0]}: no such config field{did_you_mean(unknown[0], keys)}"
    return None
