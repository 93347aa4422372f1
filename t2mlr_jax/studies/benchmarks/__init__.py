"""The benchmarks (each the code of an entry point of experiments/ by the same name: bench, bench_lrt,
vs_release, step_forms, startup, gpu_check), their sections, one module each, and what they share. Nothing
is imported here: the release's Python imports the release sides (vs_*_torch.py, stdlib at import).

presets     the paper's layer ranges, the benchmark presets, the T²MLR and parameter-matched baseline models
flops       FLOPs: expected (the architectures' count), measured (the traced jaxpr, XLA's cost analysis)
harness     interleaved timing, the compiled train step and generate(), and the run's shared state
report      markdown tables and run metadata
decode, train, prefill, memory, throughput   bench's sections
lrt         the LRT benchmark's presets (bench_lrt), and its sections against the vanilla backbone:
            lrt_decode (decode per token), lrt_train (train step vs counted FLOPs), lrt_rows (Table 1's rows)
vs_*_ours, vs_*_torch   the two sides of vs_release, each run in a process of its own (side_by_side.py)
gpu_parts   the parts of gpu_check
"""
