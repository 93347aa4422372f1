"""FineWeb-Edu pretraining of SmolLM2-135M T²MLR (paper Table 1/2): paper window (5,26) = code l_start 4,
l_end 25, D=16, B=4, the release's recipe (configs.recipes.pretraining). 136.2M parameters (the
paper: 136.4M for every model of the comparison; the parameter-matched baseline, 584 wide: 136.4M).

Presets: release (default), paper (LR 5e-4, 20k steps); windows w1_30, w9_22, w13_18, w15_16 and the
location ablations w1_6, w25_30, w1_14, w17_30; baseline (parameter-matched transformer),
baseline_compute_matched (2.24 epochs, Table 12), looped, middle_looped, pause (Table 2 baselines), cpu
(tiny, offline text). Example:
  python main.py --config=configs/smollm135m_t2mlr.py:baseline,cpu --workdir=runs/b135
"""

from configs.recipes import pretraining
from t2mlr_jax.model.presets import smollm2_135m

WINDOWS = ((1, 30), (9, 22), (13, 18), (15, 16))
LOCATION_ABLATIONS = ((1, 6), (25, 30), (1, 14), (17, 30))


def get_config(arg=None):
    return pretraining("smollm135m_t2mlr", smollm2_135m(), (5, 26), WINDOWS + LOCATION_ABLATIONS, arg)
