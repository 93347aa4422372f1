"""The sections of experiments/bench.py, one module each, and what they share (also with
experiments/bench_lrt.py, whose presets and sections are `lrt`).

presets     the paper's layer ranges, the benchmark presets, the T²MLR and parameter-matched baseline models
flops       FLOP counts: by formula, from the traced jaxpr, and XLA's cost analysis
harness     interleaved timing, the compiled train step and generate(), and the run's shared state
report      markdown tables and run metadata
decode, train, prefill, memory, throughput   the sections
lrt         the LRT benchmark's presets (experiments/bench_lrt.py), and its sections against the vanilla
            backbone: lrt_decode (decode per token), lrt_train (train step vs counted FLOPs), lrt_rows
            (Table 1's rows)
"""
