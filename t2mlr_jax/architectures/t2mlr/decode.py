"""T²MLR's decoding (and the plain backbone's): prefill exact or by k Jacobi passes (the paper's Table 8),
then one token per step with the KV cache and R, through the shared loop (t2mlr_jax.model.generate)."""

from __future__ import annotations

import dataclasses

from jaxtyping import Array, Int

from t2mlr_jax.architectures.t2mlr.recurrence import decode_step, exact_forward, jacobi_forward
from t2mlr_jax.model.backbone import init_cache
from t2mlr_jax.model.config import ModelConfig, check_depths
from t2mlr_jax.model.generate import GenerateOutput, generate_with

PREFILLS = ("exact", "jacobi")


def check_prefill(prefill: str, prefill_passes: int) -> None:
    """Reject a bad T²MLR prefill before anything is traced."""
    if prefill not in PREFILLS:
        raise ValueError(f"prefill must be one of {PREFILLS}, got {prefill!r}")
    check_depths(prefill_passes, 0)


@dataclasses.dataclass(frozen=True)
class T2MLRDecoder:
    """The backbone with or without T²MLR: prefill exact or by `prefill_passes` Jacobi passes."""

    model: ModelConfig
    prefill_mode: str = "exact"
    prefill_passes: int = 8

    def init_cache(self, batch, num_tokens):
        return init_cache(self.model, batch, num_tokens)

    def prefill(self, params, tokens, layout, cache):
        # Without recurrence the parallel pass is exact: only T²MLR's exact prefill runs token by token.
        if self.prefill_mode == "exact" and self.model.recurrence is not None:
            return exact_forward(self.model, params, tokens, layout=layout, cache=cache)
        return jacobi_forward(
            self.model,
            params,
            tokens,
            layout=layout,
            cache=cache,
            d_forward=self.prefill_passes,
            d_backward=0,
        )

    def step(self, params, tokens, state, cache, layout):
        return decode_step(self.model, params, tokens, state, cache, layout)

    def jacobi_prefill(self) -> T2MLRDecoder | None:
        """This decoder prefilling by its Jacobi passes; None without a recurrence (nothing to iterate)."""
        return None if self.model.recurrence is None else dataclasses.replace(self, prefill_mode="jacobi")


def generate(
    cfg: ModelConfig,
    params: dict,
    prompt_tokens: Int[Array, "B P"],
    prompt_mask: Int[Array, "B P"],
    *,
    prefill: str = "exact",
    prefill_passes: int = 8,
    **kwargs,
) -> GenerateOutput:
    """T²MLR (or the plain backbone) generation; `kwargs` as `generate_with`."""
    check_prefill(prefill, prefill_passes)
    return generate_with(
        T2MLRDecoder(cfg, prefill, prefill_passes), params, prompt_tokens, prompt_mask, **kwargs
    )
