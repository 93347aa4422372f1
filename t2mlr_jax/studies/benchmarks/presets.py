"""The benchmark presets and the models they compare: T²MLR over the paper's layer ranges, scaled to the
preset's depth, and the plain transformer widened to T²MLR's parameter count."""

import dataclasses

from t2mlr_jax.architectures.t2mlr import recurrent
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.params import param_specs
from t2mlr_jax.model.presets import smollm2_135m
from t2mlr_jax.model.spec import count_params, matched_width, spec_shapes

# The paper's ranges on the 30-layer SmolLM2-135M: (a, b) 1-based -> code l_start (l_end = L-1-l_start).
PAPER_LAYERS = 30
PAPER_L_START = {"(1,30)": 0, "(5,26)": 4, "(9,22)": 8, "(13,18)": 12}
ALL_RANGES = tuple(PAPER_L_START)


@dataclasses.dataclass(frozen=True)
class Preset:
    model: ModelConfig  # the T²MLR backbone; the recurrence range is set per variant
    repeats: int
    decode_ranges: tuple[str, ...]
    decode_lengths: tuple[int, ...]
    decode_batches: tuple[int, ...]
    prompt_len: int  # Table 7 generates from BOS
    train_ranges: tuple[str, ...]
    train_batch: int
    train_seq: int
    d_forward: int
    d_backward: int
    prefill_ranges: tuple[str, ...]
    prefill_depths: tuple[int, ...]
    prefill_batch: int
    prefill_seq: int
    prefill_gamma: float = 0.5  # gammas set non-zero so that the recurrence changes the logits


PRESETS = {
    # Test-sized: seconds, compile-bound.
    "smoke": Preset(
        model=smollm2_135m(
            vocab_size=256,
            hidden_size=32,
            num_layers=4,
            num_heads=2,
            num_kv_heads=1,
            head_dim=16,
            mlp_dim=88,
            max_seq_len=128,
        ),
        repeats=2,
        decode_ranges=("(13,18)",),
        decode_lengths=(8,),
        decode_batches=(1,),
        prompt_len=1,
        train_ranges=("(13,18)",),
        train_batch=2,
        train_seq=16,
        d_forward=4,
        d_backward=2,
        prefill_ranges=("(13,18)",),
        prefill_depths=(2, 4),
        prefill_batch=2,
        prefill_seq=8,
    ),
    # CPU-sized SmolLM2 (8 layers, d 128, MLP and vocab scaled with it); lengths 1/8 of the paper's.
    "quick": Preset(
        model=smollm2_135m(
            vocab_size=4096,
            hidden_size=128,
            num_layers=8,
            num_heads=4,
            num_kv_heads=2,
            head_dim=32,
            mlp_dim=344,
            max_seq_len=1024,
        ),
        repeats=3,
        decode_ranges=ALL_RANGES,
        decode_lengths=(64, 128, 256),
        decode_batches=(1,),
        prompt_len=1,
        train_ranges=("(13,18)",),
        train_batch=4,
        train_seq=128,
        d_forward=16,
        d_backward=4,
        prefill_ranges=("(5,26)", "(13,18)"),
        prefill_depths=(4, 8, 16, 32),
        prefill_batch=4,
        prefill_seq=64,
    ),
    # The real SmolLM2-135M shapes in bf16 (parameters fp32 for training, bf16 for inference).
    "full": Preset(
        model=smollm2_135m(dtype="bfloat16"),
        repeats=5,
        decode_ranges=ALL_RANGES,
        decode_lengths=(512, 1024, 2048),
        decode_batches=(1, 8),
        prompt_len=1,
        train_ranges=("(13,18)", "(5,26)"),
        train_batch=8,
        train_seq=2048,
        d_forward=16,
        d_backward=4,
        prefill_ranges=("(5,26)", "(9,22)", "(13,18)"),
        prefill_depths=(4, 8, 16, 32),
        prefill_batch=8,
        prefill_seq=512,
    ),
}


def code_range(paper_range: str, num_layers: int) -> tuple[int, int]:
    """The paper's symmetric 30-layer range scaled to `num_layers` (identity at 30 layers)."""
    l_start = min(round(PAPER_L_START[paper_range] * num_layers / PAPER_LAYERS), (num_layers - 1) // 2)
    return l_start, num_layers - 1 - l_start


def with_range(cfg: ModelConfig, paper_range: str) -> ModelConfig:
    l_start, l_end = code_range(paper_range, cfg.num_layers)
    return recurrent(cfg, l_start=l_start, l_end=l_end)


def param_shapes(cfg: ModelConfig) -> dict:
    return spec_shapes(param_specs(cfg), cfg.param_dtype)


def num_params(cfg: ModelConfig) -> int:
    return count_params(param_shapes(cfg))


def matched_baseline(cfg: ModelConfig, multiple: int = 8) -> ModelConfig:
    """The plain transformer widened in steps of `multiple` until it has at least T²MLR's parameters
    (the paper's 576 -> 584; heads and head_dim unchanged, so the baseline is the conservative side)."""
    plain = cfg.replace(recurrence=None)
    count_at = lambda width: num_params(plain.replace(hidden_size=width))
    width = matched_width(count_at, num_params(recurrent(cfg)), cfg.hidden_size, multiple)
    return plain.replace(hidden_size=width)


def inference_config(cfg: ModelConfig) -> ModelConfig:
    """Weights stored in the compute dtype, as served; training keeps fp32 master weights."""
    return cfg.replace(param_dtype=cfg.dtype)
