"""The tests' one builder of tiny fp32 models (d <= 64, <= 4 layers), their parameters and the tiny task's
experiment configs, so the whole suite stays fast. Tests share the functions compiled for these exact
shapes: change a size and every test that uses it compiles anew (and its tolerances may move).

- model configs: `tiny_config` (the model tests'), `task_model` (the tiny task's vocabulary, no RoPE),
  `interop_config` (shaped like tests/interop's tiny Llama), `tiny_moe_config` (the MoE tests') and `NANO`
  (nanochat's block, the LRT tests'); `NANOCHAT_BLOCK`: nanochat's block features as overrides;
- parameters: `tiny_params` (the library's initialisation) and `random_params` (every γ on);
- experiments on the tiny task (tests/train/tiny_task.py): `tiny_experiment`, `tiny_lrt_experiment`;
- optimizer sections from flat fields: `optimizer`, and `pinned_optimizer` (the optimizer tests').
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from t2mlr_jax.architectures.t2mlr import RecurrenceConfig, recurrence
from t2mlr_jax.config.sections import Optimizer
from t2mlr_jax.experiment import experiment
from t2mlr_jax.model import backbone
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.params import init_params
from tests.train.tiny_task import SEQ_LEN, VOCAB

# The model's forwards compiled whole, once per (config, shapes, depths), and shared by every test that calls
# them: run eagerly, each call would recompile its scans and loops op by op (2x slower per call, every call).
jacobi = jax.jit(recurrence.jacobi_forward, static_argnums=0, static_argnames=("d_forward", "d_backward"))
exact = jax.jit(recurrence.exact_forward, static_argnums=0, static_argnames=("bptt",))
plain = jax.jit(backbone.forward, static_argnums=0)


def tiny_config(recurrence=True, **changes) -> ModelConfig:
    """4 layers of 4 heads (2 KV heads), recurrence over layers 1-2 (True), the given one, or none."""
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
    return cfg.replace(**changes)


def task_model(recurrence: RecurrenceConfig | None = None, **changes) -> ModelConfig:
    """The tiny task's model: its vocabulary, 3 layers of 2 heads, no positional encoding."""
    return tiny_config(
        recurrence,
        vocab_size=VOCAB,
        num_layers=3,
        num_heads=2,
        head_dim=16,
        rope_theta=None,
        max_seq_len=64,
        **changes,
    )


def interop_config(kv_heads: int = 2, tied: bool = False, **recurrence) -> ModelConfig:
    """tiny_config in the sizes of tests/interop's tiny Llama (vocabulary 61, MLP 48, RoPE base 5000)."""
    return tiny_config(
        RecurrenceConfig(**{"l_start": 1, "l_end": 2, **recurrence}),
        vocab_size=61,
        num_kv_heads=kv_heads,
        mlp_dim=48,
        rope_theta=5000.0,
        tie_embeddings=tied,
    )


# nanochat's block features at tiny size, as overrides: weightless norms, a normed embedding, QK-norm after
# RoPE, sliding windows of 3 keys on every other layer, resid / x0 scalars and gated value embeddings.
NANOCHAT_BLOCK = dict(
    norm_weights=False,
    embed_norm=True,
    qk_norm="after_rope",
    window_pattern="SL",
    sliding_window=3,
    resid_scalars=True,
    value_embeds=True,
    gate_channels=8,
)

# nanochat's block at toy size (the LRT tests'): every feature the LRT touches (value embeddings, resid / x0
# scalars, sliding windows, QK-norm, softcaps, dropless MoE so that routing is per token).
NANO = tiny_config(
    False,
    vocab_size=48,
    num_layers=3,
    num_heads=2,
    num_kv_heads=1,
    head_dim=16,
    tie_embeddings=False,
    logit_softcap=15.0,
    mlp="moe",
    moe_experts=4,
    moe_dim=16,
    moe_capacity_factor=None,
    init_scheme="nanochat",
    **NANOCHAT_BLOCK,
)


def tiny_moe_config(**changes) -> ModelConfig:
    """The MoE tests' model: 2 layers of 2 heads, 4 experts of width 24 (top 2), weights drawn at std 0.3."""
    cfg = tiny_config(
        False,
        vocab_size=32,
        num_layers=2,
        num_heads=2,
        num_kv_heads=2,
        mlp_dim=24,
        mlp="moe",
        moe_experts=4,
        moe_top_k=2,
        init_std=0.3,
    )
    return cfg.replace(**changes)


def tiny_params(cfg: ModelConfig, seed: int = 0, gamma: float = 0.0) -> dict:
    """Fresh parameters; with gamma != 0 the fusion is switched on (every gamma set to `gamma`)."""
    params = init_params(cfg, jax.random.PRNGKey(seed))
    if "mixer" in params and gamma:
        params["mixer"] = {
            k: (jnp.full_like(v, gamma) if k.startswith("rezero_gamma") else v)
            for k, v in params["mixer"].items()
        }
    return params


def random_params(cfg: ModelConfig, seed: int = 0) -> dict:
    """Random parameters drawn with numpy (JAX's RNG would compile once per shape): weights ~ N(0, 0.1),
    norm scales in [0.5, 1.5], and every γ in [0.5, 1] so the fusion is on."""
    rng = np.random.default_rng(seed)

    def draw(path, leaf):
        name = jax.tree_util.keystr(path)
        if "norm" in name or "scale" in name:
            value = rng.uniform(0.5, 1.5, leaf.shape)
        elif "gamma" in name:
            value = rng.uniform(0.5, 1.0, leaf.shape)
        else:
            value = rng.normal(0.0, 0.1, leaf.shape)
        return jnp.asarray(value, leaf.dtype)

    return jax.tree_util.tree_map_with_path(draw, jax.eval_shape(lambda: init_params(cfg, jax.random.key(0))))


def tokens(batch: int, length: int, seed: int = 1, vocab: int = 64):
    return jax.random.randint(jax.random.PRNGKey(seed), (batch, length), 1, vocab)


def rel_err(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def tiny_experiment(arch: str = "t2mlr", steps: int = 6, sections: dict | None = None, **train):
    """The full config of `arch` on the tiny task: task_model, batches of 8, a checkpoint every 2 steps;
    T²MLR's recurrence on layer 1 alone, 4 Jacobi passes, 2 of them differentiated."""
    config = experiment(
        name="tiny",
        arch=arch,
        model=task_model(),
        data={"task": "tiny", "seq_len": SEQ_LEN},
        optimizer=dict(lr=3e-3, warmup_ratio=0.1),
        train={
            "steps": steps,
            "batch_size": 8,
            "log_every": 2,
            "checkpoint_every": 2,
            "progress": False,
            **train,
        },
        evaluation=dict(batch_size=8),
        sections=sections or {},
    )
    config.model.recurrence.l_start = 1
    config.model.recurrence.l_end = 1
    config.model.recurrence.d_forward = 4
    config.model.recurrence.d_backward = 2
    return config


def tiny_lrt_experiment(steps: int = 6, **train):
    """The tiny task on an LRT with every stateful part: MoE routing biases (balanced fast), P sampled per
    step, Muon."""
    config = tiny_experiment("lrt", steps=steps, **train)
    model = config.model
    model.mlp, model.moe_experts, model.moe_dim, model.moe_bias_rate = "moe", 4, 32, 0.01
    model.resid_scalars = True
    config.optimizer.name = "muon"
    return config


def optimizer(**fields) -> Optimizer:
    """An optimizer section from flat fields: one the core section lacks goes to the chosen optimizer's own
    section when that has it, else to the (schedule's) section that does: optimizer(name="muon", b1=0.8,
    decay_ratio=1.0) sets optimizer.muon.b1 and optimizer.linear_decay.decay_ratio."""
    section = Optimizer(name=fields.get("name", "adamw"))
    core = {f.name for f in dataclasses.fields(Optimizer)}
    order = sorted(section.sections, key=lambda n: n != section.name)  # the chosen optimizer's first
    top, inner = {}, {}
    for key, value in fields.items():
        if key in core:
            top[key] = value
            continue
        owner = next(n for n in order if key in {f.name for f in dataclasses.fields(section.sections[n])})
        inner.setdefault(owner, {})[key] = value
    return section.replace(**top, **inner)


# What the optimizer tests pin, whatever the defaults: peak LR 1 (a schedule's value is its multiplier), no
# clipping, Adam's b2 and eps and the schedules' own fields; PINNED_MUON: muon's (nanochat's) b1, group LRs
# and momentum.
PINNED_OPTIMIZER = dict(
    lr=1.0, b2=0.95, eps=1e-8, decay_steps=0, decay_ratio=0.5, grad_clip=0.0, gate_lr_multiplier=1.0
)
PINNED_MUON = dict(
    name="muon",
    b1=0.8,
    matrix_lr=0.02,
    embedding_lr=0.3,
    head_lr=0.004,
    scalar_lr=0.5,
    momentum_start=0.85,
    momentum_end=0.95,
    batch_tokens=0,
)


def pinned_optimizer(recipe: dict, **changes) -> Optimizer:
    """`optimizer` of PINNED_OPTIMIZER, a test file's `recipe` over it and a test's `changes` over both."""
    return optimizer(**{**PINNED_OPTIMIZER, **recipe, **changes})


def score(arch, params, tokens, model_state=None):
    """An architecture's teacher-forced (eval) logits of one document per row, every token recurrent."""
    ones = jnp.ones_like(tokens)
    batch = {
        "tokens": tokens,
        "positions": jnp.cumsum(ones, 1) - 1,
        "segment_ids": ones,
        "control_flow": 2 * ones,
    }
    state = arch.init_model_state() if model_state is None else model_state
    return arch.apply(params, batch, training=False, rng=None, model_state=state).logits
