"""The report: markdown tables and cell formats shared by the sections, the run's metadata, and the page."""

import dataclasses
import platform

import jax

from t2mlr_jax.architectures.t2mlr import recurrent
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.studies.benchmarks.harness import Bench
from t2mlr_jax.studies.benchmarks.presets import num_params


def markdown_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(map(str, row)) + " |" for row in rows])


def ms(seconds: float) -> str:
    return f"{1e3 * seconds:.1f}"


def times(ratio: float | None, digits: int = 3) -> str:
    return "—" if ratio is None else f"{ratio:.{digits}f}×"


def size(num_bytes: int | float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if num_bytes < 1024:
            return f"{num_bytes:.1f} {unit}"
        num_bytes /= 1024
    return f"{num_bytes:.2f} GiB"


def layers(code_range: list[int] | None) -> str:
    return "—" if code_range is None else f"{code_range[0]}–{code_range[1]}"


def describe(cfg: ModelConfig) -> str:
    return (
        f"{cfg.num_layers} layers, d {cfg.hidden_size}, {cfg.num_heads}/{cfg.num_kv_heads} heads "
        f"x {cfg.head_dim}, MLP {cfg.mlp_dim}, vocab {cfg.vocab_size}, {cfg.dtype}, "
        f"{num_params(cfg):,} params"
    )


def environment(name: str, command: str, argv: list[str]) -> dict:
    """What every benchmark page records about its run: preset, exact command, device and versions."""
    device = jax.devices()[0]
    return {
        "preset": name,
        "command": " ".join([command, *argv]),
        "device": f"{device.platform}: {device.device_kind}",
        "jax": jax.__version__,
        "python": platform.python_version(),
    }


def metadata(name: str, bench: Bench, argv: list[str]) -> dict:
    return {
        **environment(name, "python -m experiments.bench", argv),
        "repeats": bench.preset.repeats,
        "seed": bench.seed,
        "t2mlr": describe(recurrent(bench.preset.model)),
        "baseline": describe(bench.baseline),
        "preset_settings": {k: v for k, v in dataclasses.asdict(bench.preset).items() if k != "model"},
    }


def page(title: str, header: list[str], sections: dict[str, dict]) -> str:
    """A benchmark page: the title, header lines, then one part per section (its table and notes), keyed
    by the section's title."""
    parts = [f"# {title}", "", *header]
    for name, section in sections.items():
        parts += ["", f"## {name}", "", section["markdown"], "", *(f"- {n}" for n in section["notes"])]
    return "\n".join(parts) + "\n"


def run_line(meta: dict) -> str:
    return (
        f"`{meta['command']}` on {meta['device']}, jax {meta['jax']}, {meta['repeats']} repetitions "
        "(medians of side-by-side ratios)."
    )


def render(meta: dict, sections: dict[str, dict]) -> str:
    """The T²MLR page: the run's header, then one part per section, keyed by its title."""
    header = [
        run_line(meta),
        "",
        f"- T²MLR backbone: {meta['t2mlr']}",
        f"- parameter-matched baseline: {meta['baseline']}",
    ]
    return page(f"T²MLR cost benchmark ({meta['preset']})", header, sections)
