"""The Latent Recurrent Transformer with latent thought slots: its settings and training (architecture.py),
the passes and the feedback (forward.py), the thought-slot layout (thought_slots.py), and the LRT release's
interleaved GPT in nanochat's checkpoint format (release.py, registered on import). PonderLM-2 is this
machinery with the feedback off; it and the release interop use only what this file exports."""

from t2mlr_jax.architectures.lrt import release  # noqa: F401  (registers the release's interleaved GPT)
from t2mlr_jax.architectures.lrt.architecture import PASS_PROBS, PASSES, Draw, LRTSettings, build_lrt
from t2mlr_jax.architectures.lrt.forward import LRTConfig, lrt_specs

__all__ = ["PASSES", "PASS_PROBS", "Draw", "LRTConfig", "LRTSettings", "build_lrt", "lrt_specs"]
