"""Recirculation's claims on the shipped SmolLM2-135M (Mozer et al., ../shared/papers/004), measured with the
protocol (t2mlr_jax.studies.protocol): for each of the six mixing schemes, and for the ratio scheme with
alpha ramped over the first ten positions, the sweep's (alpha, source, destination) is chosen on half of the
held-out text windows and its % perplexity change reported on the other half, with a 95% interval over
those windows (chunks of text); the ramp's effect is the paired difference, window by window, between the
ratio scheme's chosen cell with and without it. A chosen cell whose parallel evaluation stopped at its pass
cap still moving is marked unconverged.

Two sweeps (t2mlr_jax.studies.recirculation_sweep) of configs/recirculation.py: `study` (16 windows of 256
tokens of The Tempest and The Winter's Tale, alpha in {0.04, 0.10}, the six schemes, every 6th block at most
6 apart) into <out>/schemes, and `study,ramp` into <out>/ramp. Resumable: each sweep skips the cells already
in its cells.jsonl.

  python -m experiments.recirculation_study                       # ~30 min on 2 cores
  python -m experiments.recirculation_study --out=runs/recirc_study

Writes, in --out (default runs/recirculation_study): each sweep's folder, and
  preregistration.json  before anything runs: both sweeps' settings, the claims, the commit (a rerun into
                the same --out with other settings is refused)
  results.json  per scheme (and the ramp) the chosen cell, its change on the selection and the report
                windows with the interval, convergence, the verdict; the ramp's paired difference
  results.md    the table (also printed)
  results.png   each scheme's reported change with its interval
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

from t2mlr_jax.analysis.plots import interval_rows, subplots
from t2mlr_jax.config.cli import OneLineParser, fail
from t2mlr_jax.studies import ROOT, runner
from t2mlr_jax.studies.analysis_common import setup_jax
from t2mlr_jax.studies.preregistration import preregister
from t2mlr_jax.studies.protocol import Claim, Interval, interval, verdict

COMMAND = "python -m experiments.recirculation_study"
SWEEPS = {"schemes": "study", "ramp": "study,ramp"}  # workdir -> configs/recirculation.py presets
PAPER_CHANGE = "lower, by < 0.5% outside the Gemma family (Sec. 4.4, Fig. 7)"
PAPER_RAMP = "a small further reduction (Sec. 4.3)"


def sweep_config(presets: str):
    from t2mlr_jax.config.edit import config_module
    from t2mlr_jax.experiment import resolve

    return resolve(config_module(ROOT / "configs" / "recirculation.py").get_config(presets))


def claims(schemes: str) -> list[Claim]:
    """The claims judged, fixed before anything runs: each scheme's chosen cell lowers perplexity against
    the model without recirculation; the ramp lowers it further than the ratio scheme's chosen cell."""
    rows = [Claim(scheme, "baseline", PAPER_CHANGE, -1) for scheme in schemes.split(",")]
    return [*rows, Claim("ratio + ramp", "ratio", PAPER_RAMP, -1)]


def sweep_recipe(config) -> dict:
    """What a sweep's figures depend on (nothing is trained): the model, the grid, the text windows and the
    seed that splits them."""
    from t2mlr_jax.config.convert import to_dict

    settings = to_dict(config)
    return {k: settings[k] for k in ("init_from", "recirculation", "data", "eval", "seed")}


def judged(chosen: dict, label: str) -> dict:
    """A chosen cell reported on the report windows: its interval, the verdict on the paper's claim that it
    lowers perplexity, unless its parallel evaluation had not converged (then marked, not judged)."""
    report = Interval(**chosen["report"]["interval"])
    converged = chosen.get("converged", True) is not False
    return {
        "row": label,
        "cell": {k: chosen[k] for k in ("scheme", "alpha", "source", "destination")},
        "selection_change_pct": chosen["selection_change_pct"],
        "report_change_pct": chosen["report"]["change_pct"],
        "interval": chosen["report"]["interval"],
        "converged": chosen.get("converged"),
        "final_change": chosen.get("final_change"),
        "verdict": verdict(report, -1)
        if converged
        else f"unconverged (final change {chosen['final_change']:.2g})",
    }


def ramp_effect(with_ramp: dict, without: dict) -> dict:
    """The ramp's paired difference, window by window over the same report windows, in % perplexity."""
    a, b = with_ramp["report"]["per_window_pct"], without["report"]["per_window_pct"]
    difference = interval([x - y for x, y in zip(a, b)])
    return {
        "row": "ratio + ramp − ratio",
        "difference": dataclasses.asdict(difference),
        "verdict": verdict(difference, -1),
    }


def render(meta: dict, rows: list[dict], ramp: dict, baseline: dict) -> str:
    lines = [
        "# Recirculation on SmolLM2-135M: the claims, chosen on one split and reported on the other",
        "",
        f"`{meta['command']}` at commit `{meta['commit']}`, wall time {meta['wall_seconds']:.0f} s. "
        f"Baseline perplexity {baseline['perplexity']:.3f} "
        f"({baseline.get('bpb', float('nan')):.4f} bits per byte) over {meta['windows']} windows of "
        f"{meta['window']} tokens: each cell chosen on {meta['selection']} of them, reported on the other "
        f"{meta['report']} with a 95% interval over those windows.",
        "",
        "| scheme | chosen cell (α, s → d) | selection Δ% | report Δ% (95%) | paper | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        c, i = r["cell"], Interval(**r["interval"])
        lines.append(
            f"| {r['row']} | α {c['alpha']:g}, {c['source']} → {c['destination']} | "
            f"{r['selection_change_pct']:+.3f} | "
            f"{r['report_change_pct']:+.3f} ({i.low:+.3f}, {i.high:+.3f}) | "
            f"{PAPER_CHANGE} | {r['verdict']} |"
        )
    d = Interval(**ramp["difference"])
    lines += [
        "",
        f"Ramp (α × min(t / 10, 1)), paired over the report windows: {ramp['row']} = {d.mean:+.3f}% "
        f"({d.low:+.3f}, {d.high:+.3f}); paper: {PAPER_RAMP}; verdict: {ramp['verdict']}.",
        "",
        "Seed-to-seed noise does not apply (nothing is trained); the spread is the text's: the report "
        "windows' standard deviation of the change is "
        + ", ".join(f"{r['row']} {r['interval']['std']:.3f}" for r in rows)
        + " (% perplexity).",
    ]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    fig, ax = subplots(figsize=(7, 4))
    labels, intervals = [r["row"] for r in rows], [r["interval"] for r in rows]
    xlabel = "% perplexity change on the report windows (mean, 95%)"
    interval_rows(ax, labels, intervals, xlabel=xlabel, title="each scheme's chosen cell", zero=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    parser = OneLineParser(prog=COMMAND, description=__doc__)
    parser.add_argument("--out", default="runs/recirculation_study", help="output directory")
    args = parser.parse_args(argv)
    out, started = Path(args.out), time.time()
    from t2mlr_jax.studies.recirculation_sweep import checked, run_sweep

    try:  # both sweeps checked, then pre-registered, before either loads or compiles anything
        configs = {name: sweep_config(presets) for name, presets in SWEEPS.items()}
        for config in configs.values():
            checked(config)
        registration = preregister(
            out,
            {name: sweep_recipe(config) for name, config in configs.items()},
            claims(configs["schemes"].recirculation.sweep_schemes),
            {
                "command": " ".join([COMMAND, *argv]),
                "selection": "each scheme's best cell on the selection windows",
            },
        )  # another grid, text or split in the same --out: refused (RecipeMismatch), nothing run
    except (ValueError, KeyError, FileNotFoundError) as e:
        fail(e)
    setup_jax(out)

    # the sweeps × one repeat, a table of the study runner (each resumes from its own cells.jsonl); the
    # repeats of the claims are the report windows inside each sweep, judged below
    sweep = lambda name, _: run_sweep(configs[name], out / name)
    sweeps = runner.by_row(runner.run(runner.Study(runner.grid(list(configs)), sweep, desc="sweeps")).results)
    schemes, ramped = sweeps["schemes"], sweeps["ramp"]
    if schemes["selection"] != ramped["selection"]:
        raise RuntimeError("the two sweeps chose on different windows: their report windows cannot be paired")
    rows = [judged(chosen, scheme) for scheme, chosen in schemes["best_by_scheme"].items()]
    ramp_best = ramped["best_by_scheme"]["ratio"]
    rows.append(judged(ramp_best, "ratio + ramp"))
    ramp = ramp_effect(ramp_best, schemes["best_by_scheme"]["ratio"])
    selection = schemes["selection"]
    meta = {
        "command": " ".join([COMMAND, *argv]),
        "commit": registration["commit"],
        "wall_seconds": round(time.time() - started, 1),
        "windows": schemes["settings"]["windows"]["count"],
        "window": schemes["settings"]["windows"]["length"],
        "selection": len(selection["selection_windows"]),
        "report": len(selection["report_windows"]),
    }
    payload = {"meta": meta, "baseline": schemes["baseline"], "rows": rows, "ramp": ramp}
    runner.write_json(out / "results.json", payload)
    text = render(meta, rows, ramp, schemes["baseline"])
    (out / "results.md").write_text(text)
    plot(rows, out / "results.png")
    print(text)
    return payload
