"""Recirculation on a pretrained model (forward.py), as architectures of the house:

recirculation           training-free: --mode=eval scores config.init_from's model with the pathway of
                        config.recirculation, --mode=generate decodes with it (KV cache), and --mode=train
                        (nothing to train) runs the sweep of experiments/recirculation.py instead
recirculation_adaptive  the paper's learned variant: per-channel alpha, beta from a small MLP trained by the
                        trainer over the frozen pretrained model (parallel two-stack, fixed passes)

Both read the `recirculation` section (below); `stack` chooses the paper's two-stack or the single-stack
(T²MLR's path with the parameter-free mixer).
"""

from __future__ import annotations

import dataclasses

import jax

from t2mlr_jax.architectures.contract import (
    Architecture,
    CachedGenerate,
    Outputs,
    layout_of,
    register_architecture,
)
from t2mlr_jax.architectures.recirculation.forward import (
    ADAPTIVE,
    EVALUATIONS,
    STACKS,
    TwoStackDecoder,
    recirculated_logits,
    single_stack_model,
)
from t2mlr_jax.architectures.recirculation.mix import Recirculation, adaptive_specs
from t2mlr_jax.architectures.t2mlr import T2MLRDecoder, stateless
from t2mlr_jax.config.sections import Experiment, one_of
from t2mlr_jax.model import flops
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.params import param_specs
from t2mlr_jax.model.spec import freeze


@dataclasses.dataclass(frozen=True)
class RecirculationSettings:
    """The pathway (config section `recirculation`, read by both architectures) and the sweep."""

    # Blocks, 0-based: the output of block `source` folded into the output of block `destination`
    # (HF hidden_states[source + 1] into hidden_states[destination + 1]); the paper's best Gemma3 1B pair.
    source: int = 11
    destination: int = 4
    alpha: float = 0.1
    scheme: str = "ratio"  # none | ratio | nonconvex | renorm | orthogonal | slerp
    ramp: bool = False  # alpha x min(t / 10, 1) at position t
    stack: str = "two"  # two (the paper: a second pass per token) | single (T²MLR's path, parameter-free)
    evaluation: str = "serial"  # two-stack scoring / prefill: serial (exact) | parallel (Jacobi passes)
    parallel_tol: float = 1e-4  # parallel: stop when no source state moves by more than this (relative)
    parallel_max_passes: int = 16
    temperature: float = 1.0  # logits / temperature (the paper's control: 1.2)
    adaptive_hidden: int = 0  # recirculation_adaptive: the MLP's width; 0 = hidden_size
    # The sweep (--mode=train of arch recirculation; experiments/recirculation.py)
    sweep_alphas: str = "0.04,0.07,0.10,0.16"
    sweep_schemes: str = "ratio"
    sweep_max_gap: int = 12  # pairs with destination < source <= destination + max_gap
    sweep_stride: int = 1  # every stride-th source and destination block
    sweep_controls: bool = True  # temperature and training-free looping beside the grid
    sweep_control_temperature: float = 1.2
    # best cells also scored serially (passes, perplexity gap, speed-up); 0 = none
    sweep_serial_check: int = 2
    # the share of eval windows the best cell is chosen on; it is reported on the others (seeded split)
    sweep_selection_fraction: float = 0.5

    def __post_init__(self):
        one_of("recirculation.stack", self.stack, STACKS)
        one_of("recirculation.evaluation", self.evaluation, EVALUATIONS)
        if self.parallel_max_passes < 1 or self.parallel_tol < 0 or self.temperature <= 0:
            raise ValueError(
                "recirculation: parallel_max_passes must be >= 1, parallel_tol >= 0 and temperature > 0, got "
                f"{self.parallel_max_passes}, {self.parallel_tol}, {self.temperature}"
            )


def settings(config: Experiment, num_layers: int, *, adaptive: bool = False) -> Recirculation:
    """The section's pathway, checked against the model (one clear error before anything compiles)."""
    s = config.recirculation
    if adaptive and s.stack != "two":
        raise ValueError(
            "recirculation_adaptive trains the two-stack's mix: recirculation.stack must be 'two'"
        )
    rc = Recirculation(s.source, s.destination, s.alpha, s.scheme, s.ramp, adaptive)
    rc.check(num_layers)
    return rc


def decoding(config: Experiment, model: ModelConfig, rc: Recirculation):
    """(params, model_state) -> (the pathway's cached decoder, what it reads): the one-stack pathway is
    T²MLR's decoder over the rewired model, the two-stack one its own."""
    s = config.recirculation

    def decoder(params, model_state):
        if s.stack == "single":
            return T2MLRDecoder(single_stack_model(model, rc)), {**params, "mixer": {}}
        prefill = dict(prefill_passes=s.parallel_max_passes, prefill_tol=s.parallel_tol)
        return TwoStackDecoder(model, rc, s.evaluation, **prefill), params

    return decoder


def _build(config: Experiment, *, adaptive: bool) -> Architecture:
    model = stateless(config.model.replace(recurrence=None))
    rc = settings(config, model.num_layers, adaptive=adaptive)
    s = config.recirculation
    parallel = dict(tol=s.parallel_tol, max_passes=s.parallel_max_passes)

    def logits(params, batch, training):
        tokens, layout = batch["tokens"], layout_of(batch)
        evaluation = s.evaluation
        if training:  # the adaptive MLP over the frozen base: the gradient reaches it through the final pass
            params = {**jax.lax.stop_gradient(params), ADAPTIVE: params[ADAPTIVE]}
            evaluation = "parallel"
        return recirculated_logits(
            model, params, rc, tokens, layout, stack=s.stack, evaluation=evaluation, **parallel
        )[0]

    def apply(params, batch, *, training, rng, model_state, sample=None):
        return Outputs(logits(params, batch, training) / s.temperature)

    specs = param_specs(model)
    count = None  # training-free: its --mode=train runs the sweep, no train step to count
    if adaptive:
        width = s.adaptive_hidden or model.hidden_size
        specs = {**freeze(specs), ADAPTIVE: adaptive_specs(model.hidden_size, width)}
        count = lambda seq_len: train_flops(model, rc, specs[ADAPTIVE], seq_len, s.parallel_max_passes)
    name = "recirculation_adaptive" if adaptive else "recirculation"
    return Architecture(
        name,
        specs,
        model.param_dtype,
        apply,
        CachedGenerate(decoding(config, model, rc)),
        backbone=model,
        max_seq_len=model.max_seq_len,
        train_flops=count,
    )


def train_flops(cfg: ModelConfig, rc: Recirculation, mlp: dict, seq_len: int, passes: int) -> float:
    """Training FLOPs of a row through the adaptive two-stack's parallel forward (`two_stack_parallel`) at
    its cap of `passes` Jacobi passes (it may stop earlier): blocks 0..d, the first pass through d+1..s, each
    further pass the mix and both passes of every token through d+1..s (two causal passes), then the mix,
    blocks d+1..L-1 and the head. Only the mix's MLP (`mlp`, its parameter table) trains: the gradient
    reaches it through the final pass, whose frozen blocks and head pass it on to their inputs only, and
    stops at the MLP's input (no input gradient of its first layer)."""
    recirculated = range(rc.destination + 1, rc.source + 1)
    final = range(rc.destination + 1, cfg.num_layers)
    mix = 2.0 * seq_len * flops.matrix_params(mlp)
    mix_backward = flops.BACKWARD * mix - 2.0 * seq_len * flops.matrix_params(mlp["fc1"])
    forward = (
        flops.pass_flops(cfg, seq_len, layers=range(rc.destination + 1))
        + flops.pass_flops(cfg, seq_len, layers=recirculated)
        + (passes - 1) * (mix + 2 * flops.pass_flops(cfg, seq_len, layers=recirculated))
        + mix
        + flops.pass_flops(cfg, seq_len, layers=final)
        + flops.head_flops(cfg, seq_len)
    )
    backward = mix_backward + flops.input_gradient_flops(cfg, seq_len, final) + flops.head_flops(cfg, seq_len)
    return forward + backward


register_architecture(
    "recirculation",
    lambda config: _build(config, adaptive=False),
    settings=RecirculationSettings,
)
register_architecture(
    "recirculation_adaptive", lambda config: _build(config, adaptive=True), section="recirculation"
)
