"""PonderLM-2: the LRT's thought slots with no cross-token feedback (architecture.py); its release's
checkpoint format (release.py, registered on import: an HF Llama folder with its pondering fields), our
evaluation forward on it (evaluation.py) and its PyTorch reference (torch_reference.py, for --verify)."""

from t2mlr_jax.architectures.ponderlm2.architecture import PonderLM2Settings
from t2mlr_jax.architectures.ponderlm2.release import (
    FIELDS,
    check_release_start,
    is_ponderlm2_release,
    load_ponderlm2_release,
    ponderlm2_settings,
    save_ponderlm2_release,
    scripts_settings,
)

__all__ = [
    "FIELDS",
    "PonderLM2Settings",
    "check_release_start",
    "is_ponderlm2_release",
    "load_ponderlm2_release",
    "ponderlm2_settings",
    "save_ponderlm2_release",
    "scripts_settings",
]
