"""The stop_gradient Jacobi passes keep no activations alive: training memory grows with B, not with D."""

import jax
import pytest

from t2mlr_jax.architectures.t2mlr.recurrence import jacobi_forward
from tests.tiny import tiny_config, tiny_params, tokens


@pytest.mark.slow
def test_jacobi_training_memory_depends_on_b_not_d():
    cfg = tiny_config()
    params = tiny_params(cfg, gamma=0.8)
    toks = tokens(4, 32)

    def temp_bytes(d, b):
        grad = jax.jit(
            jax.grad(lambda p: jacobi_forward(cfg, p, toks, d_forward=d, d_backward=b).logits.std())
        )
        return grad.lower(params).compile().memory_analysis().temp_size_in_bytes

    shallow, deep, deep_wide = temp_bytes(2, 1), temp_bytes(12, 1), temp_bytes(12, 6)
    assert deep <= 1.05 * shallow, (shallow, deep)
    assert deep_wide > 1.5 * deep, (deep, deep_wide)  # the measure can see kept activations
