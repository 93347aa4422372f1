"""Decode (the paper's Table 7): generate() time of each T²MLR range relative to the parameter-matched
baseline, per batch size and generation length."""

from t2mlr_jax.studies.benchmarks.harness import Bench, measure_interleaved, median, median_ratio, progress
from t2mlr_jax.studies.benchmarks.presets import inference_config
from t2mlr_jax.studies.benchmarks.report import layers, markdown_table, ms, times

TITLE = "Decode (Table 7)"
# Table 7: 135M generation time / baseline, by range and new tokens.
PAPER_DECODE = {
    ("(1,30)", 512): 1.070,
    ("(1,30)", 1024): 1.064,
    ("(1,30)", 2048): 1.067,
    ("(5,26)", 512): 1.076,
    ("(5,26)", 1024): 1.068,
    ("(5,26)", 2048): 1.076,
    ("(9,22)", 512): 1.082,
    ("(9,22)", 1024): 1.078,
    ("(9,22)", 2048): 1.078,
}


def run(bench: Bench) -> dict:
    p = bench.preset
    variants = {
        "baseline": inference_config(bench.baseline),
        **{r: inference_config(bench.t2mlr(r)) for r in p.decode_ranges},
    }
    rows = []
    with progress(
        "decode", len(p.decode_batches) * len(p.decode_lengths) * len(variants) * (p.repeats + 2)
    ) as bar:
        for batch in p.decode_batches:
            for n in p.decode_lengths:
                runners = {}
                for name, cfg in variants.items():
                    runners[name] = bench.decode_run(cfg, batch, n)
                    bar.update()
                seconds = measure_interleaved(runners, p.repeats, bar)
                rows += [
                    {
                        "range": r,
                        "code_range": list(variants[r].layer_range),
                        "batch": batch,
                        "new_tokens": n,
                        "seconds": median(seconds[r]),
                        "baseline_seconds": median(seconds["baseline"]),
                        "ratio": median_ratio(seconds[r], seconds["baseline"]),
                        "paper_ratio": bench.paper(PAPER_DECODE, (r, n)),
                        "seconds_all": seconds[r],
                        "baseline_seconds_all": seconds["baseline"],
                    }
                    for r in p.decode_ranges
                ]
    table = markdown_table(
        ["batch", "new tokens", "T²MLR (paper)", "code range", "baseline ms", "T²MLR ms", "ratio", "paper"],
        [
            [
                r["batch"],
                r["new_tokens"],
                r["range"],
                layers(r["code_range"]),
                ms(r["baseline_seconds"]),
                ms(r["seconds"]),
                times(r["ratio"]),
                times(r["paper_ratio"]),
            ]
            for r in rows
        ],
    )
    notes = [
        "Generation time relative to the parameter-matched baseline, greedy, from a "
        f"{p.prompt_len}-token prompt, exact prefill. Goal <= 1.03x (paper Table 7: 1.04-1.08x)."
    ]
    return {"rows": rows, "markdown": table, "notes": notes}
