"""Tiny fp32 models shared by the tests: d <= 64, <= 4 layers, so the whole suite stays fast."""

import jax
import jax.numpy as jnp
import numpy as np

from t2mlr_jax.model import backbone, recurrence
from t2mlr_jax.model.config import ModelConfig, RecurrenceConfig
from t2mlr_jax.model.params import init_params

# The model's forwards compiled whole, once per (config, shapes, depths), and shared by every test that calls
# them: run eagerly, each call would recompile its scans and loops op by op (2x slower per call, every call).
jacobi = jax.jit(recurrence.jacobi_forward, static_argnums=0, static_argnames=("d_forward", "d_backward"))
exact = jax.jit(recurrence.exact_forward, static_argnums=0, static_argnames=("bptt",))
plain = jax.jit(backbone.forward, static_argnums=0)


def tiny_config(recurrence=True, **changes) -> ModelConfig:
    rec = RecurrenceConfig(l_start=1, l_end=2) if recurrence is True else recurrence or None
    cfg = ModelConfig(
        vocab_size=64,
        hidden_size=32,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        mlp_dim=64,
        recurrence=rec,
    )
    return cfg.replace(**changes).validate()


def tiny_params(cfg: ModelConfig, seed: int = 0, gamma: float = 0.0) -> dict:
    """Fresh parameters; with gamma != 0 the fusion is switched on (every gamma set to `gamma`)."""
    params = init_params(cfg, jax.random.PRNGKey(seed))
    if "mixer" in params and gamma:
        params["mixer"] = {
            k: (jnp.full_like(v, gamma) if k.startswith("rezero_gamma") else v)
            for k, v in params["mixer"].items()
        }
    return params


def tokens(batch: int, length: int, seed: int = 1, vocab: int = 64):
    return jax.random.randint(jax.random.PRNGKey(seed), (batch, length), 1, vocab)


def rel_err(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))
