"""FineWeb-Edu pretraining at 360M (paper Tables 9/10): SmolLM2-360M backbone, paper window (9,24)
(gated-f16b4-L8), the release's recipe. Parameters: ours 366.4M with the fusion module (the SmolLM2-360M
backbone alone is 361.8M, the figure the paper reports); the parameter-matched baseline 367.9M.
Presets as in smollm135m_t2mlr.py (w1_32, w5_28, w13_20)."""

from configs.recipes import pretraining
from t2mlr_jax.model.presets import smollm2_360m


def get_config(arg=None):
    return pretraining("smollm360m_t2mlr", smollm2_360m(), (9, 24), ((1, 32), (5, 28), (13, 20)), arg)
