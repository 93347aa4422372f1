"""The depth-versus-time comparison's report (experiments/lrt_comparison.py): Tables 1-3 as markdown, the
figure (BPB vs training FLOPs, BPB vs evaluation K) and results.json / results.md / results.png."""

from __future__ import annotations

import json
import math
from pathlib import Path

from t2mlr_jax.analysis.plots import interval_rows, subplots
from t2mlr_jax.studies.benchmarks.report import markdown_table
from t2mlr_jax.studies.lrt_comparison_rows import (
    FIGURE3,
    FIXED_K,
    REFERENCE,
    TABLE3,
    flop_matched,
    paper_order,
)
from t2mlr_jax.studies.protocol import Interval, markdown


def bpb_text(value) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.4f}"


def bpb_with_interval(row: dict) -> str:
    """A row's mean BPB over its seeds, ± the 95% half-width when it ran more than one."""
    i = row.get("bpb_interval")
    return bpb_text(row["bpb"]) + (f" ± {Interval(**i).half_width:.4f}" if i else "")


def _flops(value) -> str:
    return "—" if not value else f"{value:.3g}"


def table1(results: dict) -> str:
    header = [
        "Model",
        "Row",
        "Params",
        "Params ratio",
        "Decode blocks / token",
        "Train FLOPs",
        "FLOPs / step",
        "Steps",
        "BPB ↓",
    ]
    rows = []
    for name in paper_order(results):
        r = results[name]
        k = f" (K={r['thoughts']})" if r["thoughts"] else ""
        rows.append(
            [
                r["label"],
                f"`{name}`",
                f"{r['params']:,}",
                f"{r['params_ratio']:.2f}×",
                f"{r['blocks_formula']} ({r['blocks_ratio']:.0f}×)",
                _flops(r["train_flops"]),
                _flops(r["flops_per_step"]),
                r["steps"],
                bpb_with_interval(r) + k,
            ]
        )
    return markdown_table(header, rows)


def table2(results: dict, eval_thoughts: list[int]) -> str | None:
    sampled = [n for n in paper_order(results) if len(results[n]["thoughts_trained"]) > 1]
    fixed = [n for n in FIXED_K if n in results]
    if not sampled:
        return None
    ks = sorted({*eval_thoughts, *(int(k) for n in sampled + fixed for k in results[n]["bpb_by_k"])})
    rows = []
    for name in fixed + sampled:
        r = results[name]
        trained = r["thoughts_trained"]
        what = (
            f"Fixed K={trained[0]}"
            if len(trained) == 1
            else "One model, sampled K∈{" + ",".join(map(str, trained)) + "}"
        )
        cells = []
        for k in ks:
            value = r["bpb_by_k"].get(str(k))
            cells.append("–" if value is None else bpb_text(value) + ("†" if k > max(trained) else ""))
        rows.append([f"{what} ({r['label']}, `{name}`)", *cells])
    return markdown_table(["Training", *(f"K={k}" for k in ks)], rows)


def table3(results: dict) -> str | None:
    names = [n for n in TABLE3 if n in results]
    if len(names) < 2:
        return None
    full = results["tt1"]["bpb"] if "tt1" in results else None
    rows = []
    for name in names:
        r = results[name]
        delta = "—" if name == "tt1" or full is None else f"{r['bpb'] - full:+.4f}"
        rows.append([f"{r['label']} (`{name}`)", bpb_text(r["bpb"]), delta])
    return markdown_table(["Configuration", "BPB ↓", "Increase over full LRT (tt1)"], rows)


def figure3(results: dict) -> str | None:
    """Figure 3's rows at the study's steps and FLOP-matched: steps, FLOPs, data and BPB both ways."""
    names = [n for n in FIGURE3 if n in results and flop_matched(n) in results]
    if not names:
        return None
    header = ["Row", "Steps (equal steps)", "BPB, equal steps", "Steps (equal FLOPs)", "Train FLOPs"]
    header += ["Vocabulary targets", "BPB, equal FLOPs"]
    rows = []
    for name in names:
        r, f = results[name], results[flop_matched(name)]
        equal_steps = [f"{r['label']} (`{name}`)", r["steps"], bpb_with_interval(r)]
        rows.append(
            [
                *equal_steps,
                f["steps"],
                _flops(f["train_flops"]),
                f"{f['vocab_targets']:,}",
                bpb_with_interval(f),
            ]
        )
    return markdown_table(header, rows)


def protocol_table(results: dict) -> str:
    """Per row, what the protocol matches and records: budget, head share, unique and read tokens, the
    vocabulary targets trained on, and the train / held-out parallel / held-out exact BPB that separate
    generalization from the recurrence."""
    header = [
        "Row",
        "Steps",
        "Train FLOPs",
        "Head share",
        "Unique tokens",
        "Tokens read",
        "Vocabulary targets",
    ]
    header += ["Train BPB (log)", "Held-out BPB, parallel", "Held-out BPB, exact"]
    rows = []
    for name in paper_order(results):
        r = results[name]
        tokens = lambda n: "—" if n is None else f"{n:,}"
        rows.append(
            [
                f"`{name}`",
                r["steps"],
                _flops(r["train_flops"]),
                f"{r['head_share']:.0%}",
                tokens(r["train_tokens_unique"]),
                tokens(r["train_tokens_read"]),
                tokens(r["vocab_targets"]),
                bpb_text(r["train_bpb"]),
                bpb_text(r["bpb_parallel"]),
                bpb_text(r["bpb"]),
            ]
        )
    return markdown_table(header, rows)


def _seeds_text(meta: dict) -> str:
    seeds = meta["seeds"]
    return f"Seed {seeds[0]}" if len(seeds) == 1 else f"Seeds {', '.join(map(str, seeds))} (means)"


def render(meta: dict, results: dict, judged: dict) -> str:
    parts = [
        f"# Depth versus time: the comparison ({meta['preset']})",
        "",
        f"`{meta['command']}` on {meta['device']}, jax {meta['jax']}; wall time {meta['wall_seconds']:.0f} s "
        f"(this invocation), commit `{meta['commit']}`. {_seeds_text(meta)}; "
        + (
            f"FLOP-matched: {meta['flop_budget']:.3g} training FLOPs per row."
            if meta["flop_budget"]
            else "the same training steps for every row (Tables 1-3's protocol)"
            + (
                f"; Figure 3's rows also FLOP-matched at {meta['figure3_budget']:.3g} training FLOPs "
                f"({meta['budget_reference']}'s steps)."
                if meta["figure3_budget"]
                else "."
            )
        )
        + (
            f" Every row trains on the same first {meta['train_tokens_unique']:,} tokens of the stream "
            "(revisited as epochs)."
            if meta["train_tokens_unique"]
            else ""
        )
        + f" Vocabulary {meta['vocab_size']:,} (`{meta['tokenizer']}`), bits per byte masked as "
        f"`{meta['bpb_masking']}`.",
        "",
        "## Table 1: parameters, decode blocks, training FLOPs and BPB",
        "",
        table1(results),
        "",
        f"- Params ratio: over `{REFERENCE}` ({meta['reference_params']:,} params). Decode blocks per "
        "vocabulary token: L (reference layers) × depth × loops, or L × (K + 1) for thought rows; the ratio "
        "is over the reference L.",
        "- Train FLOPs: the trainer's expected training FLOPs (refinement passes P and thought counts K "
        "averaged over their sampling distributions, the expanded attention length counted).",
        "- BPB: exact sequential recurrence with the KV cache on held-out rows of the reference length; "
        "thought rows at K shown (their largest trained K).",
    ]
    t2 = table2(results, meta["eval_thoughts"])
    if t2:
        parts += [
            "",
            "## Table 2: BPB vs evaluation thought steps K",
            "",
            t2,
            "",
            "- Each row is one trained model; sampled-K rows reuse the same weights in every column. "
            "† beyond the row's trained range, – not evaluated.",
        ]
    t3 = table3(results)
    if t3:
        parts += ["", "## Table 3: ablations of the one-thought-token LRT (at K = 1)", "", t3]
    f3 = figure3(results)
    if f3:
        parts += ["", "## Figure 3: 2L blocks per token, at equal steps and at equal training FLOPs", "", f3]
    parts += ["", "## The protocol per row", "", protocol_table(results)]
    parts += [
        "",
        "- Head share: the vocabulary projection's part of the row's training FLOPs (every head pass). "
        "Train BPB: the training log's last window (parallel refinement, sampled K). Held-out: the "
        "same weights scored by the training-time parallel refinement (its largest P) and by the exact "
        "sequential recurrence; equal for rows without a recurrence.",
    ]
    if meta.get("recipe"):
        recipe = ", ".join(f"`{k}={v}`" for k, v in meta["recipe"].items())
        parts += ["", f"Recipe (every row, fixed before any ran): {recipe}."]
    d = meta.get("diverged")
    if d:
        parts += [
            "",
            f"Diverged runs (training loss above ln V after step 10): {d['diverged']} of {d['of']}"
            + (f": {', '.join(d['runs'])} (kept in every mean)." if d["runs"] else "."),
        ]
    for table, comparison in judged.items():
        parts += ["", f"## {table}: the paper's claims, paired over seeds", ""]
        if comparison["claims"]:
            parts += [markdown(comparison, "BPB", 4)]
        for claim, why in comparison.get("refused", {}).items():
            parts += [
                f"- not judged, `{claim}`: trained under another recipe than pre-registered: {'; '.join(why)}"
            ]
    timed = [f"`{n}` {meta['row_seconds'][n]:.0f}" for n in paper_order(results) if n in meta["row_seconds"]]
    if timed:
        parts += [
            "",
            "Wall seconds per row trained or evaluated in this invocation: " + ", ".join(timed) + ".",
        ]
    return "\n".join(parts) + "\n"


def plot(results: dict, judged: dict, path: Path) -> None:
    fig, (left, right, claims) = subplots(1, 3, figsize=(19, 5.5))
    for name in paper_order(results):
        r = results[name]
        if r["train_flops"] and math.isfinite(r["bpb"]):
            left.scatter(r["train_flops"], r["bpb"], s=25)
            left.annotate(
                name, (r["train_flops"], r["bpb"]), fontsize=8, xytext=(3, 3), textcoords="offset points"
            )
    left.set_xscale("log")
    left.set(
        xlabel="training FLOPs (expected)", ylabel="BPB (exact recurrence)", title="BPB vs training FLOPs"
    )
    left.grid(alpha=0.3)
    sampled = [n for n in paper_order(results) if len(results[n]["thoughts_trained"]) > 1]
    for name in sampled:
        r = results[name]
        ks = sorted(int(k) for k in r["bpb_by_k"])
        trained = "{" + ",".join(map(str, r["thoughts_trained"])) + "}"
        (line,) = right.plot(
            ks, [r["bpb_by_k"][str(k)] for k in ks], marker="o", label=f"{name} (K∈{trained})"
        )
        beyond = [k for k in ks if k > max(r["thoughts_trained"])]  # hollow: beyond the trained range
        right.scatter(beyond, [r["bpb_by_k"][str(k)] for k in beyond], s=60, facecolors="white", zorder=3,
                      edgecolors=line.get_color())  # fmt: skip
    right.xaxis.get_major_locator().set_params(integer=True)
    right.set(xlabel="evaluation thought steps K", ylabel="BPB", title="BPB vs evaluation K (sampled-K rows)")
    right.grid(alpha=0.3)
    if sampled:
        right.legend(fontsize=8)
    judged_claims = [(table, c) for table, comparison in judged.items() for c in comparison["claims"]]
    names = [f"{t[0]}{t[-1]}: {c['row']} − {c['baseline']}" for t, c in judged_claims]
    differences = [c["difference"] for _, c in judged_claims]
    interval_rows(claims, names, differences, xlabel="Δ BPB (paired over seeds, 95%)",
                  title="the papers' claims", zero=True)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def write_results(out: Path, meta: dict, results: dict, judged: dict) -> str:
    order = paper_order(results) + [n for n in results if n not in paper_order(results)]
    payload = {"meta": meta, "rows": {n: results[n] for n in order}, "claims": judged}
    (out / "results.json").write_text(json.dumps(payload, indent=1, default=str))
    text = render(meta, results, judged)
    (out / "results.md").write_text(text)
    plot(results, judged, out / "results.png")
    return text
