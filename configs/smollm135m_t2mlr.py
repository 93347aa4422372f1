"""FineWeb-Edu pretraining of SmolLM2-135M T²MLR (paper Table 1/2): paper window (5,26) = code l_start 4,
l_end 25, D=16, B=4, the release's recipe (t2mlr_jax.config_utils.pretraining).

Presets: w1_30, w9_22, w13_18, w15_16 (other windows), baseline (parameter-matched transformer, 584 wide),
looped, middle_looped, pause (Table 2 baselines), cpu (tiny, offline text). Example:
  python main.py --config=configs/smollm135m_t2mlr.py:baseline,cpu --workdir=runs/b135
"""

from t2mlr_jax.config_utils import pretraining
from t2mlr_jax.model.config import smollm2_135m


def get_config(arg=None):
    return pretraining(
        "smollm135m_t2mlr", smollm2_135m(), (5, 26), ((1, 30), (9, 22), (13, 18), (15, 16)), arg
    )
