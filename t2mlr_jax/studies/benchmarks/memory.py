"""Peak memory: the decode state (KV cache + recurrent state) and the compiled generate() and train-step
buffers of T²MLR against the baseline; the stop-gradient Jacobi passes keep no activations."""

import jax
import jax.numpy as jnp

from t2mlr_jax.model.backbone import init_cache
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.parallel.compiled_report import memory_per_device
from t2mlr_jax.studies.benchmarks.harness import Bench, progress
from t2mlr_jax.studies.benchmarks.presets import inference_config
from t2mlr_jax.studies.benchmarks.report import markdown_table, size, times

TITLE = "Peak memory"


def memory_stats(compiled) -> dict:
    """Compiled buffer sizes (parallel.compiled_report's); peak ~ arguments + outputs - donated aliases +
    temporaries."""
    stats = memory_per_device(compiled)
    return {
        **{k: stats[k] for k in ("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes")},
        "peak_bytes": stats["total_bytes"] - stats["generated_code_bytes"],
    }


def _state_bytes(cfg: ModelConfig, batch: int, slots: int) -> dict:
    cache = jax.eval_shape(lambda: init_cache(cfg, batch, slots))
    kv = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(cache))
    recurrent = 0 if cfg.recurrence is None else batch * cfg.hidden_size * jnp.dtype(cfg.dtype).itemsize
    return {
        "kv_cache_bytes": int(kv),
        "recurrent_state_bytes": int(recurrent),
        "state_bytes": int(kv + recurrent),
    }


def _add_ratios(rows: list[dict], key: str, name: str) -> None:
    for row in rows:
        row[name] = row[key] / rows[0][key]


def run(bench: Bench) -> dict:
    p = bench.preset
    r = p.train_ranges[0]
    batch, n = max(p.decode_batches), max(p.decode_lengths)
    decode_cases = {"baseline": inference_config(bench.baseline), r: inference_config(bench.t2mlr(r))}
    # The Jacobi step at D and at D' = B+1 (no stop-gradient pass at all), both with gradient through
    # B passes: equal temporaries show that the stop-gradient passes keep nothing.
    train_cases = [
        ("baseline", bench.baseline, p.d_forward, p.d_backward),
        (r, bench.t2mlr(r), p.d_forward, p.d_backward),
        (r, bench.t2mlr(r), p.d_backward + 1, p.d_backward),
    ]
    with progress("memory", len(decode_cases) + len(train_cases)) as bar:
        decode_rows = []
        for name, cfg in decode_cases.items():
            decode_rows.append(
                {
                    "variant": name,
                    "batch": batch,
                    "slots": p.prompt_len + n,
                    **_state_bytes(cfg, batch, p.prompt_len + n),
                    "compiled": memory_stats(bench.decode_run(cfg, batch, n).compiled),
                }
            )
            bar.update()
        train_rows = []
        for name, cfg, d_forward, d_backward in train_cases:
            stats = memory_stats(bench.train_run(cfg, d_forward, d_backward).compiled)
            train_rows.append({"variant": name, "d_forward": d_forward, "d_backward": d_backward, **stats})
            bar.update()
    _add_ratios(decode_rows, "state_bytes", "state_ratio")
    _add_ratios(train_rows, "peak_bytes", "peak_ratio")
    deep, shallow = train_rows[1], train_rows[2]
    no_activations = deep["temp_bytes"] / shallow["temp_bytes"]
    tables = "\n\n".join(
        [
            markdown_table(
                [
                    "decode",
                    "batch",
                    "cache slots",
                    "KV cache",
                    "recurrent state",
                    "state ratio",
                    "generate() temporaries",
                    "generate() peak",
                ],
                [
                    [
                        d["variant"],
                        d["batch"],
                        d["slots"],
                        size(d["kv_cache_bytes"]),
                        size(d["recurrent_state_bytes"]),
                        times(d["state_ratio"], 5),
                        size(d["compiled"]["temp_bytes"]),
                        size(d["compiled"]["peak_bytes"]),
                    ]
                    for d in decode_rows
                ],
            ),
            markdown_table(
                ["train step", "D", "B", "arguments", "temporaries", "peak", "peak ratio"],
                [
                    [
                        t["variant"],
                        t["d_forward"],
                        t["d_backward"],
                        size(t["argument_bytes"]),
                        size(t["temp_bytes"]),
                        size(t["peak_bytes"]),
                        times(t["peak_ratio"]),
                    ]
                    for t in train_rows
                ],
            ),
        ]
    )
    notes = [
        "Decode state = KV cache (keys, values, slot segment ids) + one d-vector per row for T²MLR. "
        "Compiled peak = arguments + outputs - donated aliases + temporaries (compiled.memory_analysis()).",
        f"Stop-gradient passes keep no activations: temporaries of D={p.d_forward} / D={p.d_backward + 1} "
        f"(both B={p.d_backward}) = {no_activations:.3f} (1.0 = none kept).",
    ]
    return {
        "decode_rows": decode_rows,
        "train_rows": train_rows,
        "temp_ratio_deep_over_shallow": no_activations,
        "markdown": tables,
        "notes": notes,
    }
