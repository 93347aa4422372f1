"""Model configuration: the backbone (`ModelConfig`) and the temporal recurrence (`RecurrenceConfig`).

Both are frozen dataclasses so they can be static arguments of `jax.jit`. A plain transformer is a
`ModelConfig` with `recurrence=None`; T²MLR is the same backbone with a `RecurrenceConfig`.
Every field is checked in `validate()`, before anything is traced or compiled.
"""

from __future__ import annotations

import dataclasses

from t2mlr_jax.model.mixers import MIXERS

CACHE_NORMS = ("rescale", "rmsnorm", "none")
REMAT_POLICIES = ("none", "full", "dots")
DTYPES = ("float32", "bfloat16", "float16")


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
        return resolve_range(self.l_start, self.l_end, num_layers)


# The block's parts (ModelConfig fields). MLP_NAMES is the registry's key set, kept here so `validate`
# needs no JAX; `t2mlr_jax.model.layers.register_mlp` adds to it.
QK_NORMS = ("none", "before_rope", "after_rope")
WINDOW_KINDS = ("S", "L")
MLP_NAMES: set[str] = {"swiglu", "relu2"}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A decoder assembled from parts; the defaults are exactly Llama / SmolLM2, whose parameter names
    (HF Llama's) make conversion a table. NanoChat-style: norm_weights=False, embed_norm=True,
    qk_norm="after_rope", window_pattern="SSSL", mlp="relu2", tie_embeddings=False, logit_softcap=15.
    """

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
    # Norms: learned RMSNorm scales (HF names) or weightless RMSNorm everywhere (also in QK-norm).
    norm_weights: bool = True
    embed_norm: bool = False  # RMSNorm the embeddings before block 0 (nanochat)
    # QK-RMSNorm over head_dim: "before_rope" (Qwen3) or "after_rope" (nanochat); weighted iff norm_weights.
    qk_norm: str = "none"
    # Sliding-window attention: window_pattern tiles over layers (S = a query sees keys at most
    # `sliding_window` slots back, i.e. w + 1 keys with itself, FA3/nanochat's window_size=(w, 0);
    # L = full); the last layer is always L.
    window_pattern: str = "L"
    sliding_window: int | None = None
    attn_softcap: float | None = None  # attention logits -> c * tanh(z / c)
    logit_softcap: float | None = None  # output logits -> c * tanh(z / c)
    mlp: str = "swiglu"  # a key of t2mlr_jax.model.layers.MLPS (swiglu | relu2 | registered ones)
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

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        """Each layer's attention window (None = full): window_pattern tiled, the last layer full."""
        pattern = self.window_pattern
        kinds = [pattern[i % len(pattern)] for i in range(self.num_layers - 1)]
        return (*(self.sliding_window if kind == "S" else None for kind in kinds), None)

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
        self._validate_block()
        rec = self.recurrence
        if rec is None:
            return self
        MIXERS.get(rec.mixer)  # an unknown name: one ValueError listing the registered mixers
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

    def _validate_block(self) -> None:
        for name in ("norm_weights", "embed_norm"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.qk_norm not in QK_NORMS:
            raise ValueError(f"qk_norm must be one of {QK_NORMS}, got {self.qk_norm!r}")
        pattern = self.window_pattern
        if not isinstance(pattern, str) or not pattern or set(pattern) - set(WINDOW_KINDS):
            raise ValueError(f"window_pattern must be a non-empty string of {WINDOW_KINDS}, got {pattern!r}")
        if "S" in pattern and (
            isinstance(self.sliding_window, bool)
            or not isinstance(self.sliding_window, int)
            or self.sliding_window < 1
        ):
            raise ValueError(
                f"sliding_window must be an int >= 1 when window_pattern has an S, "
                f"got {self.sliding_window!r}"
            )
        if "S" not in pattern and self.sliding_window is not None:
            raise ValueError(
                f"sliding_window must be None when window_pattern ({pattern!r}) has no S, "
                f"got {self.sliding_window!r}"
            )
        for name in ("attn_softcap", "logit_softcap"):
            cap = getattr(self, name)
            if cap is not None and not cap > 0:
                raise ValueError(f"{name} must be None or > 0, got {cap!r}")
        if self.mlp not in MLP_NAMES:
            raise ValueError(f"mlp must be one of {sorted(MLP_NAMES)}, got {self.mlp!r}")


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


def resolve_range(start: int, end: int, num_layers: int) -> tuple[int, int]:
    """An inclusive 0-based block range [start, end] with a negative `end` counted from the end (L + end):
    the one rule for T²MLR's window and the looped baselines' range."""
    return start, end + num_layers if end < 0 else end
