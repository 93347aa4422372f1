"""Model configuration: the backbone (`ModelConfig`), a frozen dataclass so that it can be a static argument
of `jax.jit`. A plain transformer is a `ModelConfig` with `recurrence=None`; T²MLR is the same backbone
carrying a temporal recurrence (`Recurrence`: T²MLR's RecurrenceConfig, t2mlr_jax.architectures.t2mlr,
declares its window and its parameters). Every field is checked when the object is built (`__post_init__`),
before anything is traced or compiled; named backbones (SmolLM2, nanochat, ...) are in
t2mlr_jax.model.presets.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol, runtime_checkable

REMAT_POLICIES = ("none", "full", "dots")
DTYPES = ("float32", "bfloat16", "float16")
ATTENTION_IMPLS = ("auto", "einsum", "xla", "cudnn", "pallas")


@runtime_checkable
class Recurrence(Protocol):
    """What the backbone knows of a temporal recurrence it carries: the blocks it spans (l_start, l_end:
    0-based, a negative l_end counted from the end) and the parameters it adds (`param_specs`, stored
    under params["mixer"]). The system that runs it owns the rest (T²MLR's RecurrenceConfig)."""

    l_start: int
    l_end: int

    def layer_range(self, num_layers: int) -> tuple[int, int]: ...

    def param_specs(self, model: ModelConfig) -> dict: ...


# The sizes that fix every weight's shape (validated >= 1; what a checkpoint's shapes encode).
SHAPE_FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "mlp_dim")
# The block's parts (ModelConfig fields). MLP_NAMES is the registry's key set, kept here so the checks
# need no JAX; `t2mlr_jax.model.layers.register_mlp` adds to it.
QK_NORMS = ("none", "before_rope", "after_rope")
WINDOW_KINDS = ("S", "L")
MLP_NAMES: set[str] = {"swiglu", "relu2", "geglu"}
# normal: every weight N(0, init_std) (HF Llama). nanochat: embeddings N(0, 1), input projections
# U(±sqrt(3/d)), output projections (o_proj, MLP down) zero, lm_head N(0, 0.001), gates zero.
# nanochat_karpathy: karpathy/nanochat's init_weights (92d63d4): nanochat's, but embeddings N(0, 0.8), the
# relu² MLP's up projection at 0.4 times the bound, value-embedding and smear gates U(0, 0.02), λ_resid
# from 1.15 down to 1.05 and λ_x0 from 0.2 down to 0.05 linearly over the layers.
INIT_SCHEMES = ("normal", "nanochat", "nanochat_karpathy")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A decoder assembled from parts; the defaults are exactly Llama / SmolLM2, whose parameter names
    (HF Llama's) make conversion a table. NanoChat-style: norm_weights=False, embed_norm=True,
    qk_norm="after_rope", window_pattern="SSSL", mlp="relu2", tie_embeddings=False, logit_softcap=15
    (karpathy/nanochat's own GPT adds smear_channels, backout, ve_gate_scale: the `nanochat` preset's
    variant="karpathy").
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    mlp_dim: int
    rope_theta: float | None = 10_000.0  # None = no positional encoding (NoPE)
    # The dtype the RoPE cos / sin tables are rounded to before they rotate: nanochat keeps them in bfloat16
    # whatever the compute dtype (its release's numbers need it); float32 elsewhere.
    rope_table_dtype: str = "float32"
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    init_std: float = 0.02
    max_seq_len: int = 8192
    dtype: str = "float32"  # compute dtype; parameters stay in `param_dtype`
    param_dtype: str = "float32"
    remat: str = "none"
    # True: the train state stacks the blocks' weights [L, ...] and one lax.scan runs them (compiles once).
    # False: it holds them per layer and the blocks unroll (t2mlr_jax.model.layer_layout): faster steps
    # on a CPU, longer compiles. Checkpoints keep the form they were trained with; interop reads either.
    scan_layers: bool = True
    attention_impl: str = "auto"  # auto (by platform) | einsum (reference) | xla | cudnn (GPU) | pallas (TPU)
    # Norms: learned RMSNorm scales (HF names) or weightless RMSNorm everywhere (also in QK-norm).
    norm_weights: bool = True
    embed_norm: bool = False  # RMSNorm the embeddings before block 0 (nanochat)
    # QK-RMSNorm over head_dim: "before_rope" (Qwen3) or "after_rope" (nanochat); weighted iff norm_weights.
    qk_norm: str = "none"
    # Sliding-window attention: window_pattern tiles over layers from layer 0 (S = a query sees keys at
    # most `sliding_window` slots back, i.e. w + 1 keys with itself, FA3/nanochat's window_size=(w, 0);
    # L = full); the last layer is L while last_layer_full, else the pattern places it too (Gemma3 1B:
    # "SSSSSL" over 26 layers, the last two sliding; a string of num_layers kinds places each layer).
    window_pattern: str = "L"
    sliding_window: int | None = None
    last_layer_full: bool = True
    attn_softcap: float | None = None  # attention logits -> c * tanh(z / c)
    logit_softcap: float | None = None  # output logits -> c * tanh(z / c)
    mlp: str = "swiglu"  # a key of t2mlr_jax.model.layers.MLPS (swiglu | geglu | relu2 | moe | registered)
    # Gemma-style options (HF Gemma3): every RMSNorm scales by (1 + w), its weights offsets from 1 (zero at
    # init); embeddings times sqrt(hidden_size); "sandwich" norms, i.e. the attention and MLP outputs are
    # normed before their residual adds (then post_attention_layernorm norms the attention output and
    # pre_feedforward_layernorm the MLP input, HF Gemma's names); attention logits scaled by
    # query_pre_attn_scalar**-0.5 (None: head_dim**-0.5); sliding-window layers' RoPE base (None: rope_theta).
    norm_offset: bool = False
    embed_scale: bool = False
    sandwich_norms: bool = False
    query_pre_attn_scalar: float | None = None
    rope_local_theta: float | None = None
    init_scheme: str = "normal"
    # nanochat's per-layer scalars: the stream entering block i is λ_resid[i] * h + λ_x0[i] * x0, x0 the
    # (normed) embedding (λ_resid init 1, λ_x0 init 0.1).
    resid_scalars: bool = False
    # nanochat's value embeddings: on alternating layers (the last included) v += g * VE[token], the gate
    # per kv head g = 2 sigmoid(W x[..., :gate_channels]) with W zero-initialised (g starts at 1).
    value_embeds: bool = False
    ve_every_layer: bool = False  # value embeddings on every layer (the LRT release's interleaved models)
    gate_channels: int = 32  # input channels of the per-kv-head gates (value embeddings, LRT feedback)
    ve_gate_scale: float = 2.0  # the value embeddings' gate is ve_gate_scale * sigmoid (karpathy/nanochat: 3)
    # karpathy/nanochat's smear: the (normed) embedding of token t gets λ_smear σ(W e_t[:smear_channels])
    # times token t-1's added (none at a row's first token); None: off.
    smear_channels: int | None = None
    # karpathy/nanochat's backout: the stream after block num_layers // 2, times a learned λ_backout, is
    # subtracted from the last block's output before the final norm.
    backout: bool = False
    # Mixture of experts (mlp="moe", t2mlr_jax.model.moe): `moe_experts` routed experts of width moe_dim
    # (None = mlp_dim), each token to its top `moe_top_k` by a sigmoid router, plus `moe_shared` experts
    # every token uses. Dropless by default (None: grouped matmuls, MaxText's / megablox's); a capacity
    # factor caps each expert at capacity_factor * tokens * top_k / experts, dropping the rest; balancing
    # adds a per-expert routing bias moved by `moe_bias_rate` after each step.
    moe_experts: int = 8
    moe_top_k: int = 2
    moe_shared: int = 1
    moe_dim: int | None = None
    moe_capacity_factor: float | None = None
    moe_capacity_groups: str = "call"  # capacity over the call's B*T tokens, or per "row" (MaxText's)
    moe_bias_rate: float = 1e-3
    recurrence: Recurrence | None = None

    def replace(self, **changes) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    @property
    def layer_range(self) -> tuple[int, int]:
        if self.recurrence is None:
            raise ValueError("layer_range: this model has no recurrence (recurrence=None)")
        return self.recurrence.layer_range(self.num_layers)

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        """Each layer's attention window (None = full): window_pattern tiled from layer 0, the last layer
        full while last_layer_full."""
        pattern = self.window_pattern
        kinds = [pattern[i % len(pattern)] for i in range(self.num_layers)]
        if self.last_layer_full and kinds:
            kinds[-1] = "L"
        return tuple(self.sliding_window if kind == "S" else None for kind in kinds)

    @property
    def layer_rope_thetas(self) -> tuple[float, ...] | None:
        """Each layer's RoPE base when sliding layers have their own (rope_local_theta), else None."""
        if self.rope_local_theta is None:
            return None
        return tuple(self.rope_theta if w is None else self.rope_local_theta for w in self.layer_windows)

    def __post_init__(self):
        """One ValueError naming the offending field, before anything is traced or compiled."""
        for name in (*SHAPE_FIELDS, "max_seq_len"):
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
        for name in ("dtype", "param_dtype", "rope_table_dtype"):
            if getattr(self, name) not in DTYPES:
                raise ValueError(f"{name} must be one of {DTYPES}, got {getattr(self, name)!r}")
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"remat must be one of {REMAT_POLICIES}, got {self.remat!r}")
        if self.attention_impl not in ATTENTION_IMPLS:
            raise ValueError(f"attention_impl must be one of {ATTENTION_IMPLS}, got {self.attention_impl!r}")
        self._validate_block()
        rec = self.recurrence
        if rec is None:
            return
        if not 0 <= rec.l_start < self.num_layers:
            raise ValueError(f"recurrence.l_start={rec.l_start} out of range [0, {self.num_layers})")
        l_start, l_end = rec.layer_range(self.num_layers)
        if not 0 <= l_end < self.num_layers:
            raise ValueError(f"recurrence.l_end={rec.l_end} out of range for {self.num_layers} layers")
        if l_end < l_start:
            raise ValueError(f"recurrence.l_end ({l_end}) must be >= l_start ({l_start})")

    def _validate_block(self) -> None:
        for name in ("norm_weights", "embed_norm", "norm_offset", "embed_scale", "sandwich_norms"):
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
        for name in ("attn_softcap", "logit_softcap", "query_pre_attn_scalar"):
            cap = getattr(self, name)
            if cap is not None and not cap > 0:
                raise ValueError(f"{name} must be None or > 0, got {cap!r}")
        if self.norm_offset and not self.norm_weights:
            raise ValueError("norm_offset (True) needs norm_weights=True: the offsets are the norms' weights")
        if self.rope_local_theta is not None and (self.rope_theta is None or not self.rope_local_theta > 0):
            raise ValueError(
                f"rope_local_theta must be None or > 0 with a rope_theta, got {self.rope_local_theta!r} "
                f"(rope_theta {self.rope_theta!r})"
            )
        if self.mlp not in MLP_NAMES:
            raise ValueError(f"mlp must be one of {sorted(MLP_NAMES)}, got {self.mlp!r}")
        if self.init_scheme not in INIT_SCHEMES:
            raise ValueError(f"init_scheme must be one of {INIT_SCHEMES}, got {self.init_scheme!r}")
        for name in ("resid_scalars", "value_embeds", "ve_every_layer", "last_layer_full", "backout"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.gate_channels < 1 or self.value_embeds and self.gate_channels > self.hidden_size:
            raise ValueError(
                f"gate_channels must be in [1, hidden_size={self.hidden_size}], got {self.gate_channels}"
            )
        if not self.ve_gate_scale > 0:
            raise ValueError(f"ve_gate_scale must be > 0, got {self.ve_gate_scale!r}")
        smear = self.smear_channels
        if smear is not None and (isinstance(smear, bool) or not 1 <= smear <= self.hidden_size):
            raise ValueError(
                f"smear_channels must be None or in [1, hidden_size={self.hidden_size}], got {smear!r}"
            )
        if self.backout and self.num_layers < 2:
            raise ValueError("backout needs num_layers >= 2: it subtracts block num_layers // 2's output")
        if self.mlp == "moe":
            self._validate_moe()

    def _validate_moe(self) -> None:
        if self.moe_experts < 1 or self.moe_shared < 0:
            raise ValueError(
                f"moe_experts must be >= 1 and moe_shared >= 0, got {self.moe_experts}, {self.moe_shared}"
            )
        if not 1 <= self.moe_top_k <= self.moe_experts:
            raise ValueError(
                f"moe_top_k ({self.moe_top_k}) must be in [1, moe_experts={self.moe_experts}]: each token "
                "picks top_k distinct experts"
            )
        if self.moe_dim is not None and self.moe_dim < 1:
            raise ValueError(f"moe_dim must be None or >= 1, got {self.moe_dim}")
        if self.moe_capacity_factor is not None and not self.moe_capacity_factor > 0:
            raise ValueError(
                f"moe_capacity_factor must be None (no drops) or > 0, got {self.moe_capacity_factor}"
            )
        if not self.moe_bias_rate >= 0:
            raise ValueError(f"moe_bias_rate must be >= 0, got {self.moe_bias_rate}")
        if self.moe_capacity_groups not in ("call", "row"):
            raise ValueError(f"moe_capacity_groups must be 'call' or 'row', got {self.moe_capacity_groups!r}")

    @property
    def routed_experts(self) -> int:
        """Experts to split over the mesh's expert axis: moe_experts with the MoE MLP, else none."""
        return self.moe_experts if self.mlp == "moe" else 0

    @property
    def expert_dim(self) -> int:
        return self.mlp_dim if self.moe_dim is None else self.moe_dim

    @property
    def backout_layer(self) -> int | None:
        """The block whose output backout subtracts (num_layers // 2, nanochat's), None without backout."""
        return self.num_layers // 2 if self.backout else None

    @property
    def value_embed_layers(self) -> tuple[int, ...]:
        """The layers with value embeddings: alternating, the last one included (nanochat's rule), or every
        layer (ve_every_layer)."""
        if not self.value_embeds:
            return ()
        every = 1 if self.ve_every_layer else 2
        return tuple(i for i in range(self.num_layers) if (self.num_layers - 1 - i) % every == 0)


def check_depths(d_forward: int, d_backward: int) -> None:
    """Jacobi depths: D >= 1 passes through the middle block, gradient through the last B >= 0."""
    if int(d_forward) < 1:
        raise ValueError(f"d_forward (D) must be >= 1, got {d_forward}")
    if int(d_backward) < 0:
        raise ValueError(f"d_backward (B) must be >= 0, got {d_backward}")


def resolve_range(start: int, end: int, num_layers: int) -> tuple[int, int]:
    """An inclusive 0-based block range [start, end] with a negative `end` counted from the end (L + end):
    the one rule for T²MLR's window and the looped baselines' range."""
    return start, end + num_layers if end < 0 else end
