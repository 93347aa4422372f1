"""PonderLM-2 (Zeng et al. 2025), the depth-versus-time paper's baseline without cross-token feedback.

After each token x_t come K thought slots; the input of thought slot j is the last hidden state (after the
final norm) of the slot before it, and the last slot predicts x_{t+1}. Thoughts share the token's position
id, every slot writes keys / values, nothing is fed into x_{t+1} except through attention. Training is
Jacobi refinement: a vocabulary-only pass fills the thought slots, then P refinement passes (P drawn as
the LRT's), the loss read at the last pass only. Decoding: K + 1 forwards per token, a (K + 1)x cache.

It is the LRT's thought-slot machinery with the feedback switched off (lrt.py: feedback="none",
cross_token=False, supervise="last"), so the two differ exactly where the papers say they do.
`ponderlm2.embed_scale`: token embeddings x sqrt(2.5 H) (H = hidden size), the release's `scale_embeds`.

Read against the public release (LUMIA-Group/PonderLM-2, its modeling_llama.py): its training runs K growing
initialisation passes (a vocabulary-only pass, then passes over 1, ..., K - 1 thoughts, each filling one
more thought slot), then R Jacobi refinements (R uniform in {2, 3}: `random_jacobi_iterations`) and a final
pass that the loss reads; its evaluation is that forward at R = `num_jacobi_iterations` (3). Ours by
default (`ponderlm2.init="vocabulary"`) fills every thought slot from the one vocabulary-only pass, then P
refinement passes supervised at the last, P from the depth-versus-time paper's distribution (E[P] = 2, as
the LRT rows), and evaluates by the exact sequential recurrence: PonderLM-2 as that paper runs it, on the
LRT's thought-slot machinery, differing from the LRT only where the papers say. The release's behaviour,
number for number (architectures/ponderlm2/release.py reads it off a release checkpoint, and a start
from one keeps its embedding scale: check_release_start):
  ponderlm2.init="growing", embed_scale=True, passes=(3, 4), pass_probs=(0.5, 0.5), eval_passes=4
(P counts the refinements plus the final pass). At K = 1 the two initialisations are the same.
"""

from __future__ import annotations

import dataclasses
import math

from t2mlr_jax.architectures.contract import (
    Architecture,
    Capabilities,
    register_architecture,
)
from t2mlr_jax.architectures.lrt import PASS_PROBS, PASSES, LRTSettings, build_lrt
from t2mlr_jax.config.sections import Experiment


@dataclasses.dataclass(frozen=True)
class PonderLM2Settings:
    """PonderLM-2's config section `ponderlm2`; the rest of its LRT settings are fixed (`_build`)."""

    thoughts: tuple[int, ...] = (1,)  # thought counts K drawn uniformly per step (the paper's: (1,), (2,))
    passes: tuple[int, ...] = PASSES  # refinement pass counts P ...
    pass_probs: tuple[float, ...] = PASS_PROBS  # ... and their probabilities (as the LRT's)
    embed_scale: bool = False  # token embeddings x sqrt(2.5 H)
    init: str = "vocabulary"  # thought slots filled by: the vocabulary-only pass | growing (the release's)
    eval_passes: int = 0  # 0: the exact sequential recurrence; n: the release's parallel evaluation, n passes


INITS = ("vocabulary", "growing")


def _build(config: Experiment) -> Architecture:
    s = config.ponderlm2
    if s.init not in INITS:
        raise ValueError(f"ponderlm2.init must be one of {INITS}, got {s.init!r}")
    if s.eval_passes < 0:
        raise ValueError(f"ponderlm2.eval_passes must be >= 0 (0: the exact recurrence), got {s.eval_passes}")
    fixed = LRTSettings(
        feedback="none",
        thoughts=s.thoughts,
        cross_token=False,
        passes=s.passes,
        pass_probs=s.pass_probs,
        supervise="last",
        eval_mode="parallel" if s.eval_passes else "exact",
        eval_passes=s.eval_passes or 1,
    )
    scale = math.sqrt(2.5 * config.model.hidden_size) if s.embed_scale else 1.0
    return build_lrt(
        config,
        "ponderlm2",
        fixed,
        section="ponderlm2",
        thought_model=True,
        embed_scale=scale,
        growing=s.init == "growing",
    )


register_architecture(
    "ponderlm2",
    _build,
    settings=PonderLM2Settings,
    identity=("thoughts", "embed_scale"),
    capabilities=Capabilities(thought_slots=True),
)
