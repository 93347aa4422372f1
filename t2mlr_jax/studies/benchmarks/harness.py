"""What the sections share: side-by-side timing, the compiled programs they time (a Jacobi train step,
generate()), and `Bench`, the run's state, which builds each program once.

Every ratio is measured side by side: the variants are interleaved in each repetition (order rotated per
repetition), a warm-up call excludes compilation, each timed call is wrapped in block_until_ready, and
the median over repetitions of the per-repetition ratio is reported.
"""

import dataclasses
import sys
import time
from collections.abc import Callable, Hashable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm import tqdm

from t2mlr_jax.architectures.t2mlr import generate
from t2mlr_jax.architectures.t2mlr.recurrence import jacobi_forward
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.params import init_params
from t2mlr_jax.studies.benchmarks.flops import jaxpr_matmul_flops
from t2mlr_jax.studies.benchmarks.presets import PAPER_LAYERS, Preset, with_range


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start


def measure_interleaved(
    runners: dict[Hashable, Callable[[], Any]], repeats: int, bar: tqdm
) -> dict[Hashable, list[float]]:
    """Seconds per call of each runner: one warm-up call each (compilation), then `repeats` rounds in
    which every runner runs once, the order rotated per round so that no variant always runs first."""
    for fn in runners.values():
        jax.block_until_ready(fn())
        bar.update()
    names = list(runners)
    seconds = {name: [] for name in names}
    for rep in range(repeats):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            seconds[name].append(timed(runners[name]))
            bar.update()
    return seconds


def median(values) -> float:
    return float(np.median(values))


def median_ratio(numerator: list[float], denominator: list[float]) -> float:
    """Median over repetitions of the ratio measured within each repetition."""
    return median(np.asarray(numerator) / np.asarray(denominator))


def progress(desc: str, total: int) -> tqdm:
    return tqdm(total=total, desc=desc, unit="call", file=sys.stderr, leave=False)


def random_tokens(cfg: ModelConfig, batch: int, length: int, seed: int) -> jax.Array:
    return jax.random.randint(jax.random.PRNGKey(seed), (batch, length), 1, cfg.vocab_size, jnp.int32)


def compile_jacobi_step(
    cfg: ModelConfig, d_forward: int, d_backward: int, optimizer: optax.GradientTransformation
):
    def loss_fn(params, tokens):
        logits = jacobi_forward(cfg, params, tokens, d_forward=d_forward, d_backward=d_backward).logits
        return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], tokens[:, 1:]).mean()

    def step(params, opt_state, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return jax.jit(step, donate_argnums=(0, 1))


class TrainRun:
    """One compiled train step (parameters and optimizer state donated) and the state it advances."""

    def __init__(self, cfg: ModelConfig, d_forward: int, d_backward: int, batch: int, seq: int, seed: int):
        optimizer = optax.adamw(6e-4, b1=0.9, b2=0.98, weight_decay=0.01)  # the release's pretraining AdamW
        params = init_params(cfg, jax.random.PRNGKey(seed))
        self.state = (params, optimizer.init(params))
        self.tokens = random_tokens(cfg, batch, seq, seed + 1)
        traced = compile_jacobi_step(cfg, d_forward, d_backward, optimizer).trace(*self.state, self.tokens)
        self.jaxpr_flops = jaxpr_matmul_flops(traced.jaxpr)
        self.compiled = traced.lower().compile()

    def __call__(self):
        params, opt_state, loss = self.compiled(*self.state, self.tokens)
        self.state = (params, opt_state)
        return self.state, loss


class DecodeRun:
    """One compiled generate() (greedy, from a constant prompt); calling it generates once."""

    def __init__(self, cfg: ModelConfig, params: dict, batch: int, prompt_len: int, new_tokens: int):
        prompt = jnp.ones((batch, prompt_len), jnp.int32)
        self.args = (params, prompt, jnp.ones_like(prompt))
        fn = jax.jit(lambda p, t, m: generate(cfg, p, t, m, max_new_tokens=new_tokens).tokens)
        self.compiled = fn.lower(*self.args).compile()

    def __call__(self):
        return self.compiled(*self.args)


@dataclasses.dataclass
class Bench:
    """One run: its preset and baseline, the sections' results so far, and the programs built for them."""

    preset: Preset
    baseline: ModelConfig
    peak_flops: float | None
    seed: int
    results: dict = dataclasses.field(default_factory=dict)
    _memo: dict = dataclasses.field(default_factory=dict)

    def _once(self, key, build: Callable[[], Any]):
        """Build each compiled program or parameter tree once; the memory section reuses the timed ones."""
        if key not in self._memo:
            self._memo[key] = build()
        return self._memo[key]

    def t2mlr(self, paper_range: str) -> ModelConfig:
        return with_range(self.preset.model, paper_range)

    def paper(self, table: dict, key) -> float | None:
        """The paper's figure, shown only next to measurements of its own 30-layer shapes."""
        return table.get(key) if self.preset.model.num_layers == PAPER_LAYERS else None

    def train_run(self, cfg: ModelConfig, d_forward: int, d_backward: int) -> TrainRun:
        p = self.preset
        return self._once(
            ("train", cfg, d_forward, d_backward),
            lambda: TrainRun(cfg, d_forward, d_backward, p.train_batch, p.train_seq, self.seed),
        )

    def decode_run(self, cfg: ModelConfig, batch: int, new_tokens: int) -> DecodeRun:
        return self._once(
            ("decode", cfg, batch, new_tokens),
            lambda: DecodeRun(cfg, self.params(cfg), batch, self.preset.prompt_len, new_tokens),
        )

    def params(self, cfg: ModelConfig) -> dict:
        return self._once(("params", cfg), lambda: init_params(cfg, jax.random.PRNGKey(self.seed)))
