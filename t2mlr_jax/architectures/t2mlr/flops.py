"""T²MLR's expected training FLOPs, in the backbone's accounting (t2mlr_jax.model.flops): the Jacobi forward's
passes and the exact recurrence's token-by-token chain, each with the fusion."""

from __future__ import annotations

from t2mlr_jax.architectures.t2mlr.fusion import mixer_specs
from t2mlr_jax.model import flops
from t2mlr_jax.model.config import ModelConfig


def fusion_flops(cfg: ModelConfig, positions: int) -> float:
    """Forward FLOPs of T²MLR's fusion at `positions` positions: its mixer's matrices (W_rec and the gates
    of the release's mixer), computed at every position (the recurrent ones keep the result)."""
    return 2.0 * positions * flops.matrix_params(mixer_specs(cfg))


def jacobi_train_flops(
    cfg: ModelConfig, seq_len: int, d_forward: int | None = None, d_backward: int | None = None
) -> float:
    """Training FLOPs of a row through T²MLR's Jacobi forward (D = d_forward, B = d_backward; default: the
    model's): blocks [0, l_end] unfused, D - 1 refinements of the middle block [l_start, l_end] each behind
    the fusion, then the fusion, blocks [l_start, L) and the head. The gradient reaches the blocks below
    l_start, the final pass and the last min(B, D - 1) refinements; the unfused middle pass only when
    B >= D (R<1> is detached otherwise). Convergence-adaptive Jacobi (recurrence.jacobi_tolerance) may stop
    its detached refinements early: it is counted at the cap, D."""
    rec = cfg.recurrence
    d = rec.d_forward if d_forward is None else d_forward
    b = rec.d_backward if d_backward is None else d_backward
    l_start, l_end = cfg.layer_range
    middle = flops.pass_flops(cfg, seq_len, layers=range(l_start, l_end + 1))
    refinement = middle + fusion_flops(cfg, seq_len)
    # blocks below l_start (shared by every pass) and the final pass: both always carry gradient
    always = flops.pass_flops(cfg, seq_len) + fusion_flops(cfg, seq_len) + flops.head_flops(cfg, seq_len)
    forward = always + middle + (d - 1) * refinement
    gradient = always + min(b, d - 1) * refinement + (middle if b >= d else 0.0)
    return forward + flops.BACKWARD * gradient


def exact_train_flops(cfg: ModelConfig, seq_len: int, bptt: int | None = None) -> float:
    """Training FLOPs of a row through T²MLR's exact recurrence (token by token: the same causal pass, the
    fusion at every token). With truncated backpropagation (bptt = B) it runs B + 1 copies of the row
    side by side (recurrence.exact_forward); the first B copies count through block l_end only (their R
    feeds the next copy; their upper blocks and head, which nothing reads, are left out)."""
    l_end = cfg.layer_range[1]
    chain = flops.pass_flops(cfg, seq_len, layers=range(l_end + 1)) + fusion_flops(cfg, seq_len)
    rest = flops.pass_flops(cfg, seq_len, layers=range(l_end + 1, cfg.num_layers)) + flops.head_flops(
        cfg, seq_len
    )
    return flops.train((1 + (bptt or 0)) * chain + rest)


def exact_forward_flops(cfg: ModelConfig, seq_len: int) -> float:
    """Forward FLOPs of a row run token by token (exact evaluation; generation's exact prefill and decode
    steps together): every block, T²MLR's fusion (none without the recurrence), the head at every position."""
    fusion = 0.0 if cfg.recurrence is None else fusion_flops(cfg, seq_len)
    return flops.pass_flops(cfg, seq_len) + fusion + flops.head_flops(cfg, seq_len)
