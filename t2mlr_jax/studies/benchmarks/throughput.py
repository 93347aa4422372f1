"""Throughput and MFU: tokens/s and model FLOP utilisation of the train and decode sections' timings
(the architectures' FLOP count over time over the chip's dense bf16 peak)."""

from t2mlr_jax.parallel.chips import CHIPS
from t2mlr_jax.studies.benchmarks.flops import expected_decode_flops
from t2mlr_jax.studies.benchmarks.harness import Bench
from t2mlr_jax.studies.benchmarks.report import markdown_table

TITLE = "Throughput and MFU"
NEEDS = ("decode", "train")  # computed from these sections' timings, so they run first


def default_peak_flops(device) -> float | None:
    """The chip's dense bf16 peak (t2mlr_jax/parallel/chips.py); None on a CPU or a chip not in the table."""
    chip = CHIPS.get(device.device_kind)
    return None if device.platform == "cpu" or chip is None else chip.peak_flops


def _row(workload: str, variant: str, tokens: int, flops: float, seconds: float, peak: float | None) -> dict:
    achieved = flops / seconds
    return {
        "workload": workload,
        "variant": variant,
        "tokens_per_second": tokens / seconds,
        "flops": flops,
        "flops_per_second": achieved,
        "mfu": None if peak is None else achieved / peak,
    }


def run(bench: Bench) -> dict:
    p = bench.preset
    peak, n = bench.peak_flops, max(p.decode_lengths)
    rows = [
        _row("train", t["variant"], p.train_batch * p.train_seq, t["flops"], t["seconds"], peak)
        for t in bench.results["train"]["rows"]
    ]
    for batch in p.decode_batches:
        decoded = [d for d in bench.results["decode"]["rows"] if d["batch"] == batch and d["new_tokens"] == n]
        rows.append(
            _row(
                f"decode b={batch}",
                "baseline",
                batch * n,
                expected_decode_flops(bench.baseline, batch, p.prompt_len, n),
                decoded[0]["baseline_seconds"],
                peak,
            )
        )
        rows += [
            _row(
                f"decode b={batch}",
                d["range"],
                batch * n,
                expected_decode_flops(bench.t2mlr(d["range"]), batch, p.prompt_len, n),
                d["seconds"],
                peak,
            )
            for d in decoded
        ]
    table = markdown_table(
        ["workload", "variant", "tokens/s", "counted GFLOP", "GFLOP/s", "MFU"],
        [
            [
                r["workload"],
                r["variant"],
                f"{r['tokens_per_second']:,.0f}",
                f"{r['flops'] / 1e9:,.1f}",
                f"{r['flops_per_second'] / 1e9:,.1f}",
                "null" if r["mfu"] is None else f"{r['mfu']:.1%}",
            ]
            for r in rows
        ],
    )
    peak_text = (
        "none (CPU or unknown device: pass --peak_tflops)" if peak is None else f"{peak / 1e12:.0f} TFLOP/s"
    )
    notes = [
        "MFU = counted FLOPs (the architectures' count: matmuls, causal attention, the Jacobi refinement "
        f"passes; flops_per_step for training) / time / dense bf16 peak; peak {peak_text}. Decode: the "
        f"longest generation ({n} tokens), its exact prefill and decode steps, each position fed once."
    ]
    return {"rows": rows, "peak_flops": peak, "markdown": table, "notes": notes}
