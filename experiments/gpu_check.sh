#!/usr/bin/env bash
# The GPU check (docs/gpu_check.md): one run of at most 10 minutes on one H100 / H200 measuring attention
# kernels (cudnn / xla / einsum, equal and timed), the bf16 135M train step of the transformer, T²MLR and
# the LRT (ms, tokens/s, MFU), decode tok/s with T²MLR's overhead (Table 7) and Jacobi prefill speed-ups
# (Table 8), into <out>/gpu_check.json and <out>/gpu_check.md.
#
# Needs: a Python with jax on CUDA (pip install -U "jax[cuda12]") and this repository's requirements
# (pip install -e .); this script puts the repo root on PYTHONPATH. $PYTHON picks the interpreter
# (default: python). Without a GPU backend it stops with one line, unless --dry-run (tiny sizes, CPU).
#
#   experiments/gpu_check.sh --out=runs/gpu_check
#   experiments/gpu_check.sh --dry-run --out=/tmp/gpu_check
#   experiments/gpu_check.sh --help          # this header, then every flag of python -m experiments.gpu_check
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
for arg in "$@"; do
  if [[ "$arg" == "-h" || "$arg" == "--help" ]]; then
    sed -n '2,/^set /{/^set /d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
    break
  fi
done
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-$(command -v python || command -v python3)}" -m experiments.gpu_check "$@"
