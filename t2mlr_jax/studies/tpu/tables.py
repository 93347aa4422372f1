"""The tables of experiments/tpu_scaling.py from its rows' reports: per program, per chip, the train steps and
their ratios, and the calibration anchors' estimates beside their measurements."""

from __future__ import annotations

import math
import statistics

from t2mlr_jax.parallel.chips import chip_of
from t2mlr_jax.studies.tpu.rows import ANCHORS, Anchor, maxtext_flops


def _mesh(setting: dict) -> str:
    axes = ",".join(f"{k}:{v}" for k, v in setting["mesh"].items() if v > 1)
    return f"{axes} ZeRO-{setting['zero']}" if "zero" in setting else axes


# Median measured / estimated step of the calibration anchors (`--study=calibration`, docs/tpu_compile.md):
# the roofline's MFU over it is the calibrated estimate the README quotes.
CALIBRATION = 1.36


def _mfu(line: dict) -> str:
    if line["mfu"] is None:
        return "—"
    return f"{100 * line['mfu']:.0f}% ({100 * line['mfu'] / CALIBRATION:.0f}%)"


def _asked_gib(p: dict) -> float | None:
    """The GiB of temporaries a program libtpu refused for its size asked for; None for any other."""
    return p["memory"]["temp_bytes"] / 2**30 if "roofline" not in p and "memory" in p else None


def _refused(p: dict) -> str | None:
    """A program libtpu refused for its size, as two table cells; None for any other."""
    return None if _asked_gib(p) is None else f"> {_asked_gib(p):.0f} (temporaries) | **no**"


def table(results: list[dict]) -> str:
    """One line per (row, arch, program): the row's pod and mesh, per-device memory, the estimate."""
    lines = [
        "| row | arch | program | chips | mesh | GiB / device | fits | est. step ms | bound | "
        "MFU (calibrated) | collectives (count) | kernels |",
        "|---" * 12 + "|",
    ]
    for result in results:
        row = result["row"]
        if "error" in result:
            lines.append(
                f"| {row['name']} | {row['arch']} | — | {row['topology']} | {row['mesh']} | "
                f"**failed**: {result['error']} |||||||"
            )
            continue
        setting = result["setting"]
        mesh = _mesh(setting)
        for p in result["programs"]:
            chips = f"{setting['chips']} × {setting['chip']}"
            where = f"| {row['name']} | {p['arch']} | {p['program']} | {chips} | {mesh}"
            if "roofline" not in p:  # failed, none such, or refused by the compiler for its size
                if _refused(p):
                    lines.append(f"{where} | {_refused(p)} |||||")
                else:
                    lines.append(f"{where} | {p.get('skipped') or '**failed**: ' + p['error'][:200]} ||||||")
                continue
            memory, line = p["memory"], p["roofline"]
            collectives = ", ".join(f"{k} {v['count']}" for k, v in p["collectives"].items() if v["count"])
            lines.append(
                f"{where} | {memory['total_bytes'] / 2**30:.2f} | {'yes' if memory['fits'] else '**no**'} | "
                f"{1e3 * line['step_s']:.3g} | {line['bound']} | "
                f"{_mfu(line)} | {collectives or '—'} | "
                f"{sum(p.get('kernels', {}).values())} |"
            )
    return "\n".join(lines) + "\n"


def train_table(results: list[dict]) -> str:
    """The README's table: one line per (row, arch) train step, with its pod, mesh, per-chip memory
    against HBM, the estimate and the collectives per step."""
    lines = [
        "| row | arch | mesh | GiB / chip (available) | fits | est. step (bound) | MFU (calibrated) | "
        "collectives per step |",
        "|---" * 8 + "|",
    ]
    for result in results:
        row = result["row"]
        for p in result.get("programs", []):
            if p["program"] != "train":
                continue
            where = f"| {row['name']} | {p['arch']} | {_mesh(result['setting'])}"
            if "roofline" not in p:
                lines.append(f"{where} | {_refused(p) or '**failed**: ' + p.get('error', '')[:120]} ||||")
                continue
            memory, line = p["memory"], p["roofline"]
            gib = f"{memory['total_bytes'] / 2**30:.1f} / {memory['available_hbm_bytes'] / 2**30:.2f}"
            collectives = ", ".join(f"{v['count']} {k}" for k, v in p["collectives"].items() if v["count"])
            lines.append(
                f"{where} | {gib} | {'yes' if memory['fits'] else '**no**'} | "
                f"{1e3 * line['step_s']:.0f} ms ({line['bound']}) | {_mfu(line)} | {collectives or '—'} |"
            )
        if "error" in result:
            lines.append(
                f"| {row['name']} | {row['arch']} | {row['mesh']} | **failed**: {result['error']} ||||"
            )
    return "\n".join(lines) + "\n" if len(lines) > 2 else ""


def per_chip_table(results: list[dict]) -> str:
    """The train steps of a recipe compiled at several rows per chip (`NAME` at its plan's, `NAME_xN` at N),
    one line per (recipe, arch): per-chip memory and the estimate (calibrated MFU) at each."""
    cells: dict[tuple[str, str], dict[int, str]] = {}
    for result in results:
        name = result["row"]["name"].partition("_x")[0]
        for p in result.get("programs", []):
            if p["program"] != "train":
                continue
            if "roofline" not in p:
                asked = _asked_gib(p)
                cell = "**failed**" if asked is None else f"**does not fit**: {asked:.0f} GiB"
            else:
                line, gib = p["roofline"], p["memory"]["total_bytes"] / 2**30
                fits = "" if p["memory"]["fits"] else " **does not fit**"
                cell = f"{gib:.1f} GiB{fits}, {1e3 * line['step_s']:.0f} ms {line['bound']}, {_mfu(line)}"
            per_chip = result["setting"]["batch"] // result["setting"]["chips"]
            cells.setdefault((name, p["arch"]), {})[per_chip] = cell
    if not any(len(row) > 1 for row in cells.values()):
        return ""
    counts = sorted({n for row in cells.values() for n in row})
    header = " | ".join(f"{n} row{'s' if n > 1 else ''} per chip" for n in counts)
    lines = [f"| row | arch | {header} |", "|---" * (2 + len(counts)) + "|"]
    for (name, arch), row in cells.items():
        lines.append(f"| {name} | {arch} | " + " | ".join(row.get(n, "—") for n in counts) + " |")
    return "\n".join(lines) + "\n"


def train_ratios(results: list[dict]) -> str:
    """Per row compiling T²MLR beside the transformer: the estimated train-step time ratio beside the
    counted FLOP ratio (each architecture's `train_flops`)."""
    lines = [
        "| row | T²MLR / transformer: est. step | counted FLOPs | T²MLR bound | transformer bound |",
        "|---|---|---|---|---|",
    ]
    for result in results:
        train = {
            p["arch"]: p for p in result.get("programs", []) if p["program"] == "train" and "roofline" in p
        }
        if {"t2mlr", "transformer"} <= set(train):
            t2, tf = train["t2mlr"]["roofline"], train["transformer"]["roofline"]
            lines.append(
                f"| {result['row']['name']} | {t2['step_s'] / tf['step_s']:.2f}× | "
                f"{t2['model_flops'] / tf['model_flops']:.2f}× | {t2['bound']} | {tf['bound']} |"
            )
    return "\n".join(lines) + "\n" if len(lines) > 2 else ""


def shapes(a: Anchor) -> str:
    m = a.model
    heads = f"{m['num_heads']} x {m['head_dim']} heads" + (
        " (MHA)" if m["num_kv_heads"] == m["num_heads"] else f", {m['num_kv_heads']} kv"
    )
    mlp = f"{m.get('mlp', 'swiglu')} {m['mlp_dim']}"
    if m.get("mlp") == "moe":
        mlp = f"{m['moe_experts']} relu2 experts {m['mlp_dim']}, top {m['moe_top_k']}"
    vocab = f"vocab {m['vocab_size']}" + (" tied" if m["tie_embeddings"] else "")
    return (
        f"{m['num_layers']} x {m['hidden_size']}, {heads}, {mlp}, {vocab}; {a.batch} x {a.seq_len} tokens, "
        f"{a.mesh}, remat {a.remat}"
    )


def _estimates(results: list[dict]) -> list[tuple[Anchor, dict | str, float, float]]:
    """Per anchor: (anchor, its compiled train step or why there is none, roofline MFU, serial-bound
    MFU), both on MaxText's FLOP count."""
    anchors, found = {a.name: a for a in ANCHORS}, []
    for result in results:
        a = anchors[result["row"]["name"]]
        programs = [p for p in result.get("programs", []) if p["program"] == "train"]
        train = [p for p in programs if "roofline" in p]
        if not train:
            asked = _asked_gib(programs[0]) if programs else None
            why = (
                f"**not compiled**: {result.get('error', '')}"
                if asked is None
                else f"**does not fit**: {asked:.0f} GiB of temporaries"
            )
            found.append((a, why, math.nan, math.nan))
            continue
        line, peak = train[0]["roofline"], chip_of(train[0]["device_kind"]).peak_flops
        flops = maxtext_flops(a.model, a.seq_len) * a.batch * a.seq_len / train[0]["devices"]
        serial = line["compute_s"] + line["memory_s"] + line["communication_s"]
        found.append((a, train[0], flops / (line["step_s"] * peak), flops / (serial * peak)))
    return found


def calibration_table(results: list[dict]) -> str:
    """Per anchor: the measured MFU beside our estimate of the same run, both on MaxText's FLOP count
    (`maxtext_flops`): the roofline (the largest of compute, memory and communication time: perfect
    overlap) and the serial bound (their sum: no overlap). The calibrated estimate divides the roofline's
    MFU by the median of measured / estimated step over the other anchors (leave-one-out: no anchor
    calibrates itself); differences are in MFU points."""
    found = _estimates(results)
    ratios = {a.name: estimate / a.mfu for a, train, estimate, _ in found if isinstance(train, dict)}
    lines = [
        "| anchor | measured MFU | roofline | difference | serial bound | measured / estimated step | "
        "calibrated | difference | fits | our shapes | differs from MaxText |",
        "|---" * 11 + "|",
    ]
    for a, train, estimate, serial in found:
        if not isinstance(train, dict):
            lines.append(f"| {a.name} | {100 * a.mfu:.1f}% | {train} ||||||| {shapes(a)} | {a.differs} |")
            continue
        others = [r for name, r in ratios.items() if name != a.name]
        calibrated = estimate / statistics.median(others) if others else math.nan
        lines.append(
            f"| {a.name} | {100 * a.mfu:.1f}% | {100 * estimate:.1f}% | {100 * (estimate - a.mfu):+.1f} | "
            f"{100 * serial:.1f}% | {ratios[a.name]:.2f} | {100 * calibrated:.1f}% | "
            f"{100 * (calibrated - a.mfu):+.1f} | {'yes' if train['memory']['fits'] else '**no**'} | "
            f"{shapes(a)} | {a.differs} |"
        )
    if ratios:
        lines.append(
            f"\nMedian measured / estimated step over the {len(ratios)} anchors: "
            f"{statistics.median(ratios.values()):.2f} (`CALIBRATION`)."
        )
    return "\n".join(lines) + "\n"
