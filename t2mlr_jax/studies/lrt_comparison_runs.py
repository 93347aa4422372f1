"""One run of the LRT comparison (t2mlr_jax/studies/lrt_comparison.py) trained and scored: a row at a seed,
by the exact recurrence and the parallel refinement and at each evaluated K; a row's results over its seeds;
and the papers' claims (lrt_comparison_rows.CLAIMS) judged on them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from tqdm import tqdm

from t2mlr_jax.analysis.run_logs import metric_trajectory
from t2mlr_jax.studies import runner
from t2mlr_jax.studies.analysis_common import evaluated
from t2mlr_jax.studies.lrt_comparison_rows import (
    CLAIMS,
    ROWS,
    ROWS_CONFIG,
    at_k,
    base_row,
    decode_blocks,
    trained_name,
)


def parallel_overrides(config) -> dict | None:
    """Evaluation by the training-time parallel refinement (its largest trained pass count) instead of the
    exact recurrence; None for rows without a recurrence (both forms are the same forward)."""
    if config.arch == "lrt" and config.lrt.feedback != "none":
        return {"lrt.eval_mode": "parallel", "lrt.eval_passes": max(config.lrt.passes)}
    if config.arch == "ponderlm2":
        return {"ponderlm2.eval_passes": max(config.ponderlm2.passes)}
    return None


def run_seed(row: str, config, workdir: Path, eval_thoughts: tuple[int, ...]) -> dict:
    """Train (or resume, or skip) one row at one seed and evaluate it: exact recurrence at its K, the
    parallel refinement at its K, and, trained with sampled K, exact at each K of eval_thoughts. Its
    figures, with `new` = whether anything was computed now (or `stopped_by` when a signal stopped it)."""
    from t2mlr_jax.experiment import resolve
    from t2mlr_jax.storage.workdir import SUMMARY
    from t2mlr_jax.studies.recipe_rule import diverged
    from t2mlr_jax.train.build_data import build_data_source
    from t2mlr_jax.train.trainer import Run, train

    data = build_data_source(resolve(config))
    summary_path = workdir / SUMMARY
    new = not summary_path.exists()
    if new:
        run = Run(resolve(config), workdir, data, config.arch)
        tqdm.write(
            f"{workdir.relative_to(workdir.parents[1])}: training {config.arch} ({run.num_params:,} params, "
            f"{run.config.train.steps} steps"
            + (f", {run.flops_per_step:.3g} FLOPs per step" if run.flops_per_step else "")
            + ")"
        )
        summary = train(run)
        if "stopped_by" in summary:
            return summary
    else:
        summary = json.loads(summary_path.read_text())
    k_own = ROWS_CONFIG.decode_thoughts(config)
    bpb_by_k = {k_own: summary["eval"]["bpb"]}
    if len(ROWS_CONFIG.trained_thoughts(config)) > 1:
        for k in eval_thoughts:
            if k != k_own:
                metrics, fresh = evaluated(config, workdir, data, f"thoughts{k}", {"eval.thoughts": k})
                bpb_by_k[k], new = metrics["bpb"], new or fresh
    parallel = parallel_overrides(config)
    bpb_parallel = summary["eval"]["bpb"]
    if parallel:
        metrics, fresh = evaluated(config, workdir, data, "parallel", parallel)
        bpb_parallel, new = metrics["bpb"], new or fresh
    train_bpb = metric_trajectory(workdir, "train", "bpb")
    return {
        "params": summary["num_params"],
        "steps": summary["steps"],
        "flops_per_step": summary.get("flops_per_step"),
        "train_flops": summary.get("train_flops"),
        "train_tokens_read": summary.get("train_tokens_read"),
        "train_tokens_unique": summary.get("train_tokens_unique"),
        "vocab_targets": round(
            summary["steps"] * config.train.batch_size * ROWS_CONFIG.vocab_targets_per_row(config)
        ),
        "bpb": summary["eval"]["bpb"],
        "loss": summary["eval"]["loss"],
        "bpb_by_k": {str(k): bpb_by_k[k] for k in sorted(bpb_by_k)},
        "bpb_parallel": bpb_parallel,
        "train_bpb": train_bpb[-1][1] if train_bpb else None,
        "diverged": diverged(metric_trajectory(workdir, "train", "loss"), config.model.vocab_size),
        "new": new,
    }


def head_share_of(config) -> float:
    """The head's share of the row's training FLOPs (protocol.head_share)."""
    from t2mlr_jax.architectures import build_architecture
    from t2mlr_jax.experiment import resolve
    from t2mlr_jax.studies.protocol import head_share

    def train_flops_at(vocab: int) -> float:
        c = config.copy_and_resolve_references()
        c.model.vocab_size = vocab
        return build_architecture(resolve(c)).train_flops(c.data.seq_len)

    return head_share(train_flops_at, config.model.vocab_size)


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def row_result(name: str, config, by_seed: dict[int, dict], reference_params: int) -> dict:
    """One run name (a row, or a row trained FLOP-matched) over its seeds: the per-seed figures under
    `seeds`, their means at the top level."""
    from t2mlr_jax.studies.protocol import interval

    row = base_row(name)
    first = next(iter(by_seed.values()))
    bpbs = [r["bpb"] for r in by_seed.values()]
    ks = first["bpb_by_k"]
    return {
        "row": row,
        "label": ROWS[row].label,
        "arch": config.arch,
        "params": first["params"],
        "params_ratio": first["params"] / reference_params,
        "layers": config.model.num_layers,
        **decode_blocks(row, config),
        **{key: first[key] for key in ("flops_per_step", "train_flops", "steps", "vocab_targets")},
        **{key: first[key] for key in ("train_tokens_read", "train_tokens_unique")},
        "head_share": head_share_of(config),
        "thoughts_trained": list(ROWS_CONFIG.trained_thoughts(config)),
        "thoughts": ROWS_CONFIG.decode_thoughts(config),
        "bpb": _mean(bpbs),
        "bpb_interval": dataclasses.asdict(interval(bpbs)) if len(bpbs) > 1 else None,
        "bpb_parallel": _mean(r["bpb_parallel"] for r in by_seed.values()),
        "train_bpb": _mean(r["train_bpb"] for r in by_seed.values()),
        "loss": _mean(r["loss"] for r in by_seed.values()),
        "bpb_by_k": {k: _mean(r["bpb_by_k"][k] for r in by_seed.values()) for k in ks},
        "diverged_seeds": [int(s) for s, r in by_seed.items() if r["diverged"]],
        "seeds": {str(seed): r for seed, r in by_seed.items()},
    }


def comparisons(results: dict, refused_runs=lambda name: []) -> dict:
    """The papers' claims (lrt_comparison_rows.CLAIMS) judged on the seeds: per table, the protocol's
    comparison of the claims whose runs all exist. A claim one of whose runs `refused_runs` names (trained
    under another recipe than the pre-registered one) is not judged: listed under "refused" with why."""
    values = {}
    for name, r in results.items():
        values[name] = {int(s): v["bpb"] for s, v in r["seeds"].items()}
        if len(r["thoughts_trained"]) > 1:
            for k in next(iter(r["seeds"].values()))["bpb_by_k"]:
                values[at_k(name, int(k))] = {int(s): v["bpb_by_k"][k] for s, v in r["seeds"].items()}
    judged = {}
    for table, claims in CLAIMS.items():
        ran = [c for c in claims if c.row in values and c.baseline in values]
        if ran:
            refused = lambda name: refused_runs(trained_name(name))
            judged[table] = runner.judge(values, ran, refused, claimed_only=True)
    return judged
