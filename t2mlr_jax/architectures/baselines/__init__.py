"""The baselines the papers compare against: looped (a block range repeated), pause tokens and an LSTM.
The plain transformer lives with T²MLR (t2mlr/), the model it must equal at γ = 0."""

from t2mlr_jax.architectures.baselines import looped, lstm, pause  # noqa: F401  (register themselves)
from t2mlr_jax.architectures.baselines.looped import block_order
from t2mlr_jax.architectures.baselines.pause import PAUSE_PARAM

__all__ = ["PAUSE_PARAM", "block_order"]
