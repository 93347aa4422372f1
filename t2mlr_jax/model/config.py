"""Model configuration: the backbone (`ModelConfig`) and the temporal recurrence (`RecurrenceConfig`).

Both are frozen dataclasses so they can be static arguments of `jax.jit`. A plain transformer is a
`ModelConfig` with `recurrence=None`; T²MLR is the same backbone with a `RecurrenceConfig`.
Every field is checked in `validate()`, before anything is traced or compiled.
"""

from __future__ import annotations

import dataclasses

MIXERS = (
    "gated",
    "none",
    "constant_weight",
    "concat",
    "var_norm_gated",
    "alpha_coupled",
    "exponential_rotational_gated",
    "coconut",
    "codi",
)
GAMMA_MIXERS = ("gated", "var_norm_gated", "alpha_coupled")  # ReZero γ (fp32, 0 at init) scale the mix
PROJECTED_MIXERS = ("gated", "var_norm_gated", "alpha_coupled", "concat")  # use W_rec when enabled
CACHE_NORMS = ("rescale", "rmsnorm", "none")
REMAT_POLICIES = ("none", "full", "dots")
DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class RecurrenceConfig:
    """T²MLR settings; defaults are the authors' release (see shared/spec/t2mlr.md).

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
    gate_weight_init_std: float = 1.0  # xavier-normal gain of the gate projections
    recurrent_gate_init: float | None = None  # sigmoid(bias) at init; None = PyTorch-default bias
    input_gate_init: float | None = None
    constant_alpha: float = 0.5  # `constant_weight` mixer only
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

    def layer_range(self, num_layers: int) -> tuple[int, int]:
        """(l_start, l_end) as non-negative 0-based block indices; the single source of truth."""
        l_end = self.l_end + num_layers if self.l_end < 0 else self.l_end
        return self.l_start, l_end


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A Llama-family decoder; parameter names follow HF Llama so conversion is a table."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    mlp_dim: int
    rope_theta: float | None = 10_000.0  # None = no positional encoding (NoPE)
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    init_std: float = 0.02
    max_seq_len: int = 8192
    dtype: str = "float32"  # compute dtype; parameters stay in `param_dtype`
    param_dtype: str = "float32"
    remat: str = "none"
    recurrence: RecurrenceConfig | None = None

    def replace(self, **changes) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    def with_recurrence(self, **changes) -> ModelConfig:
        return self.replace(recurrence=dataclasses.replace(self.recurrence or RecurrenceConfig(), **changes))

    @property
    def layer_range(self) -> tuple[int, int]:
        if self.recurrence is None:
            raise ValueError("layer_range: this model has no recurrence (recurrence=None)")
        return self.recurrence.layer_range(self.num_layers)

    def validate(self) -> ModelConfig:
        """Raise one ValueError naming the offending field; returns self so calls can chain."""
        positive = (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "mlp_dim",
            "max_seq_len",
        )
        for name in positive:
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.rope_theta is not None and (self.rope_theta <= 0 or self.head_dim % 2):
            raise ValueError(
                f"rope_theta must be > 0 with an even head_dim, got {self.rope_theta}, "
                f"head_dim {self.head_dim}"
            )
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in DTYPES:
                raise ValueError(f"{name} must be one of {DTYPES}, got {getattr(self, name)!r}")
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"remat must be one of {REMAT_POLICIES}, got {self.remat!r}")
        rec = self.recurrence
        if rec is None:
            return self
        if rec.mixer not in MIXERS:
            raise ValueError(f"recurrence.mixer: unknown mixer {rec.mixer!r}; choose one of {MIXERS}")
        if rec.cache_norm not in CACHE_NORMS:
            raise ValueError(f"recurrence.cache_norm must be one of {CACHE_NORMS}, got {rec.cache_norm!r}")
        if not 0 <= rec.l_start < self.num_layers:
            raise ValueError(f"recurrence.l_start={rec.l_start} out of range [0, {self.num_layers})")
        l_start, l_end = rec.layer_range(self.num_layers)
        if not 0 <= l_end < self.num_layers:
            raise ValueError(f"recurrence.l_end={rec.l_end} out of range for {self.num_layers} layers")
        if l_end < l_start:
            raise ValueError(f"recurrence.l_end ({l_end}) must be >= l_start ({l_start})")
        check_depths(rec.d_forward, rec.d_backward)
        return self


def check_depths(d_forward: int, d_backward: int) -> None:
    """Jacobi depths: D >= 1 passes through the middle block, gradient through the last B >= 0."""
    if int(d_forward) < 1:
        raise ValueError(f"d_forward (D) must be >= 1, got {d_forward}")
    if int(d_backward) < 0:
        raise ValueError(f"d_backward (B) must be >= 0, got {d_backward}")


# ---------------------------------------------------------------------------------------------
# Presets. Numbers are the public HF configs of SmolLM2 and the paper's tiny S5 model.


def smollm2_135m(**changes) -> ModelConfig:
    return ModelConfig(
        vocab_size=49152,
        hidden_size=576,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        mlp_dim=1536,
        rope_theta=100_000.0,
        init_std=0.0417,
    ).replace(**changes)


def smollm2_360m(**changes) -> ModelConfig:
    return ModelConfig(
        vocab_size=49152,
        hidden_size=960,
        num_layers=32,
        num_heads=15,
        num_kv_heads=5,
        head_dim=64,
        mlp_dim=2560,
        rope_theta=100_000.0,
    ).replace(**changes)


def smollm2_1_7b(**changes) -> ModelConfig:
    return ModelConfig(
        vocab_size=49152,
        hidden_size=2048,
        num_layers=24,
        num_heads=32,
        num_kv_heads=32,
        head_dim=64,
        mlp_dim=8192,
        rope_theta=130_000.0,
    ).replace(**changes)


def s5_tiny(**changes) -> ModelConfig:
    """The paper's S5-retrieval model: 384 hidden, 6 layers, 6 heads, no positional encoding."""
    return ModelConfig(
        vocab_size=188,
        hidden_size=384,
        num_layers=6,
        num_heads=6,
        num_kv_heads=6,
        head_dim=64,
        mlp_dim=1536,
        rope_theta=None,
        max_seq_len=1024,
    ).replace(**changes)


# Widths of parameter-matched baselines: the extra fusion parameters of T²MLR are paid for by a
# wider plain transformer (the release's 135M baseline is 584 wide, head_dim kept at 64).
PARAM_MATCHED_HIDDEN = {"smollm2_135m": 584}

PRESETS = {
    "smollm2_135m": smollm2_135m,
    "smollm2_360m": smollm2_360m,
    "smollm2_1_7b": smollm2_1_7b,
    "s5_tiny": s5_tiny,
}


def preset(name: str, *, param_matched_baseline: bool = False, **changes) -> ModelConfig:
    """A named preset; `param_matched_baseline=True` gives the wider plain transformer."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; choose one of {sorted(PRESETS)}")
    cfg = PRESETS[name](**changes)
    if param_matched_baseline:
        if name not in PARAM_MATCHED_HIDDEN:
            raise ValueError(f"no parameter-matched baseline width is known for preset {name!r}")
        cfg = cfg.replace(hidden_size=PARAM_MATCHED_HIDDEN[name], recurrence=None)
    return cfg
