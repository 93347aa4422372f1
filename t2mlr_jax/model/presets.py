"""Named backbones: the public HF configs of SmolLM2, the paper's tiny S5 model and nanochat's at a depth,
each a `ModelConfig` whose fields `**changes` replace."""

from __future__ import annotations

from t2mlr_jax.model.config import ModelConfig


def _smollm2(changes: dict, **size) -> ModelConfig:
    """A SmolLM2 of the public HF configs: its 49,152-token vocabulary, heads of 64 and RoPE base 100,000
    under the size's own fields, then `changes`."""
    fields = {"vocab_size": 49152, "head_dim": 64, "rope_theta": 100_000.0, **size}
    return ModelConfig(**fields).replace(**changes)


def smollm2_135m(**changes) -> ModelConfig:
    return _smollm2(
        changes, hidden_size=576, num_layers=30, num_heads=9, num_kv_heads=3, mlp_dim=1536, init_std=0.0417
    )


def smollm2_360m(**changes) -> ModelConfig:
    return _smollm2(changes, hidden_size=960, num_layers=32, num_heads=15, num_kv_heads=5, mlp_dim=2560)


def smollm2_1_7b(**changes) -> ModelConfig:
    return _smollm2(
        changes,
        hidden_size=2048,
        num_layers=24,
        num_heads=32,
        num_kv_heads=32,
        mlp_dim=8192,
        rope_theta=130_000.0,
    )


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


# torch.nn.functional.rms_norm's eps when none is given, float32's machine epsilon: nanochat's every norm.
TORCH_RMS_NORM_EPS = 2.0**-23


NANOCHAT_VARIANTS = ("lrt", "karpathy")


def nanochat_short_window(seq_len: int) -> int:
    """karpathy/nanochat's "S" window: a quarter of the context rounded up to FA3's 128-key tile."""
    return -(-seq_len // 4 // 128) * 128


def nanochat(
    depth: int,
    *,
    seq_len: int = 2048,
    width: int | None = None,
    head_dim: int = 128,
    variant: str = "lrt",
    **changes,
) -> ModelConfig:
    """nanochat's backbone at a depth as the LRT paper trains it: width 64 * depth in heads of 128 (as
    many kv heads), relu² MoE (8 routed experts of width 4d/3, top-2, one shared expert: the active MLP
    width is nanochat's dense 4d), QK-norm after RoPE (its tables in bfloat16, as nanochat keeps them),
    weightless norms (also on the embedding) at torch's default eps, untied head, logit softcap 15,
    per-layer resid / x0 scalars, value embeddings on alternating layers, windows "SSSL" with S = half
    the context, nanochat's init. 16 layers: 0.80B parameters, 20 layers: 1.42B (the paper reports 0.8B /
    1.3B) with nanochat's 32,768-token vocabulary. `width` / `head_dim` shrink it (CPU presets); the MLP
    widths follow the width. variant="karpathy" is karpathy/nanochat's own GPT as of 92d63d4 instead of
    the LRT release's fork: RoPE base 100,000, "S" = a quarter of the context rounded up to 128, queries
    and keys times 1.2 after their norm (attention logits scaled 1.44 / sqrt(head_dim)), value-embedding
    gates 3 sigmoid of 12 channels, smear over 24 channels, backout, its dense relu² MLP (width 4d) and
    its init_weights (init_scheme "nanochat_karpathy")."""
    if variant not in NANOCHAT_VARIANTS:
        raise ValueError(f"nanochat variant must be one of {NANOCHAT_VARIANTS}, got {variant!r}")
    width = width or -(-64 * depth // head_dim) * head_dim
    if variant == "karpathy":
        changes = {
            "rope_theta": 100_000.0,
            "sliding_window": nanochat_short_window(seq_len),
            "query_pre_attn_scalar": head_dim / 1.2**4,
            "gate_channels": 12,
            "ve_gate_scale": 3.0,
            "smear_channels": 24,
            "backout": True,
            "init_scheme": "nanochat_karpathy",
            "mlp": "relu2",
            **changes,
        }
    fields = dict(
        vocab_size=32768,
        hidden_size=width,
        num_layers=depth,
        num_heads=width // head_dim,
        num_kv_heads=width // head_dim,
        head_dim=head_dim,
        mlp_dim=4 * width,
        rope_theta=10_000.0,
        rope_table_dtype="bfloat16",
        norm_eps=TORCH_RMS_NORM_EPS,
        tie_embeddings=False,
        max_seq_len=seq_len,
        dtype="bfloat16",
        norm_weights=False,
        embed_norm=True,
        qk_norm="after_rope",
        window_pattern="SSSL",
        sliding_window=seq_len // 2,
        logit_softcap=15.0,
        mlp="moe",
        moe_dim=round(4 * width / 3),
        init_scheme="nanochat",
        resid_scalars=True,
        value_embeds=True,
    )
    return ModelConfig(**{**fields, **changes})  # built once: checked as changed (a narrow width's gates)
