"""FineWeb-Edu pretraining at ~1B with OUR architecture (paper Table 9 reports 981.5M T²MLR vs 996.9M
baseline, gated-f16b4-L8, paper window (9,24), but gives no architecture and the release has none). Ours
keeps SmolLM2-360M's 32 layers and widens it (1536 wide, 24 / 8 heads, MLP 4608: 0.955B plain, 0.968B
with the fusion, the parameter-matched baseline 0.971B). Presets as in
smollm135m_t2mlr.py (w1_32, w5_28, w13_20)."""

from configs.recipes import pretraining
from t2mlr_jax.model.presets import smollm2_360m


def get_config(arg=None):
    model = smollm2_360m(hidden_size=1536, num_heads=24, num_kv_heads=8, mlp_dim=4608)
    return pretraining("smollm1b_t2mlr", model, (9, 24), ((1, 32), (5, 28), (13, 20)), arg)
