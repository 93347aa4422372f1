"""T²MLR's model settings: the temporal recurrence the backbone carries (`RecurrenceConfig`, the config
section `model.recurrence`, stored with the model), checking every field when built. Pure Python, like
the mixers' registry: the PyTorch reference (torch_reference.py) reads both without JAX."""

from __future__ import annotations

import dataclasses
import math
from typing import Protocol, runtime_checkable

from t2mlr_jax.architectures.t2mlr.mixers import MIXERS
from t2mlr_jax.model.config import ModelConfig, check_depths, resolve_range

CACHE_NORMS = ("rescale", "rmsnorm", "none")


@runtime_checkable
class MixerOptions(Protocol):
    """A parameter-free mixer's settings, which compute its mix of the stream x and the cache r."""

    def __call__(self, x, r, positions): ...


@dataclasses.dataclass(frozen=True)
class RecurrenceConfig:
    """T²MLR settings; defaults are the authors' release (princeton-pli/T2MLR), not the paper where they
    differ.

    Layer indices are 0-based blocks: R is read after block `l_end` of token t-1 and fused into the
    stream entering block `l_start` of token t. Negative `l_end` counts from the end (L + l_end).
    Paper notation (a, b) is 1-based: paper (13,18) == l_start=12, l_end=17.
    """

    l_start: int = 0
    l_end: int = -1
    mixer: str = "gated"
    # r = W_rec R before mixing (on in every release run).
    recurrent_projection: bool = True
    # gamma_rec / gamma_in: one fp32 scalar each, or one per channel.
    gamma_per_channel: bool = False
    # `gated` only: gamma_rec at init (raw; the mix uses its tanh), the release's
    # rezero_gamma_recurrent_gate_init. 0 (default): Phi(x, R) == x at init; nonzero: the recurrent path
    # starts open (experiments/gate_opening.py).
    gamma_recurrent_init: float = 0.0
    gate_weight_init_std: float = 1.0  # xavier-normal gain of the gate projections
    recurrent_gate_init: float | None = None  # sigmoid(bias) at init; None = PyTorch-default bias
    input_gate_init: float | None = None
    constant_alpha: float = 0.5  # `constant_weight` mixer only
    bottleneck_size: int | None = None  # `codi` mixer only: its MLP's hidden width; None = hidden_size
    pre_norm: bool = False  # RMSNorm both streams before mixing
    post_norm: bool = False  # clamped RMS rescale of the mixed-in term y
    post_norm_clamp: float = 5.0
    # The cache R_t: raw h^(l_end) (release default), or with the temporal residual
    # R_t = N(h^(l_end) + w R_{t-1}) where N is `cache_norm`.
    temporal_residual: bool = True
    temporal_residual_weight: float = 1.0
    temporal_residual_detach: bool = False
    cache_norm: str = "rescale"  # weightless clamped RMS rescale | learnable RMSNorm (paper) | none
    cache_norm_clamp: float = 5.0
    cache_norm_eps: float = 1e-6
    # Jacobi depths used when a caller does not pass them (release pretraining: D=16, B=4).
    d_forward: int = 16
    d_backward: int = 4
    # Convergence-adaptive Jacobi (beyond the paper): the detached refinement passes stop once R moves by
    # less than this between two passes (relative, the largest over the batch's rows; recurrence.py's
    # jacobi_forward), at most D-1-B of them; the last B passes still carry the gradient. None or 0: all
    # D passes, always (the release).
    jacobi_tolerance: float | None = None
    # A parameter-free mixer's own settings (a mixer registered with options=True): a frozen dataclass it
    # defines that computes the mix (recirculation's `Recirculation`); built by its architecture, not a
    # config-file field.
    mixer_options: MixerOptions | None = None

    def __post_init__(self):
        """One ValueError naming the offending field (the layer range is checked by the model, which knows
        its depth)."""
        mixer = MIXERS.get(self.mixer)  # an unknown name: one ValueError listing the registered mixers
        if self.mixer_options is not None and not mixer.options:
            raise ValueError(f"recurrence.mixer_options: mixer {self.mixer!r} takes no options")
        if self.cache_norm not in CACHE_NORMS:
            raise ValueError(f"recurrence.cache_norm must be one of {CACHE_NORMS}, got {self.cache_norm!r}")
        check_depths(self.d_forward, self.d_backward)
        if self.d_backward > self.d_forward:  # the Jacobi forward would cap it silently
            raise ValueError(
                f"recurrence.d_backward (B = {self.d_backward}) must be <= d_forward (D = {self.d_forward}): "
                "the gradient flows through at most the D passes that run"
            )
        if self.bottleneck_size is not None and int(self.bottleneck_size) < 1:
            raise ValueError(f"recurrence.bottleneck_size must be None or >= 1, got {self.bottleneck_size}")
        if not math.isfinite(float(self.gamma_recurrent_init)):
            raise ValueError(
                f"recurrence.gamma_recurrent_init must be finite, got {self.gamma_recurrent_init}"
            )
        tol = self.jacobi_tolerance
        if tol is not None and not 0 <= tol < math.inf:  # NaN fails the comparison too
            raise ValueError(f"recurrence.jacobi_tolerance must be None or a finite number >= 0, got {tol!r}")

    def layer_range(self, num_layers: int) -> tuple[int, int]:
        """(l_start, l_end) as non-negative 0-based block indices; the single source of truth."""
        return resolve_range(self.l_start, self.l_end, num_layers)

    def param_specs(self, model: ModelConfig) -> dict:
        """The fusion's parameters (the mixer's, the recurrent projection, the cache norm)."""
        from t2mlr_jax.architectures.t2mlr.fusion import mixer_specs  # JAX: only where params are built

        return mixer_specs(model)


def recurrent(model: ModelConfig, **changes) -> ModelConfig:
    """`model` carrying T²MLR's recurrence: its own with `changes`, or the release's defaults with them."""
    return model.replace(recurrence=dataclasses.replace(model.recurrence or RecurrenceConfig(), **changes))
