"""TPU pods, compiled for real from this CPU: tools/aot_compile.py once per row of a study.
What it runs: t2mlr_jax/studies/tpu/scaling.py (`python -m experiments.tpu_scaling --help`)."""

import sys

from t2mlr_jax import cpu_runtime
from t2mlr_jax.studies.tpu.scaling import main

if __name__ == "__main__":
    cpu_runtime.tune()  # this process only waits on the tool's, which tune themselves
    sys.exit(main())
