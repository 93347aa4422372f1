"""Training-free recirculation on a pretrained model: the parameter-free (or adaptive) mix (mix.py), the
side-by-side and single-stack forwards (forward.py), T²MLR's mixer that runs the single stack (mixer.py),
and the architectures with their settings (architecture.py)."""

from t2mlr_jax.architectures.recirculation import mixer  # noqa: F401  (registers mixer="recirculation")
from t2mlr_jax.architectures.recirculation.architecture import RecirculationSettings, decoding, settings
from t2mlr_jax.architectures.recirculation.mix import Recirculation

__all__ = ["Recirculation", "RecirculationSettings", "decoding", "settings"]
