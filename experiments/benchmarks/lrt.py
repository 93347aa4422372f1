"""The LRT against its vanilla backbone (experiments/bench_lrt.py): decode time per token (the paper's
Table 1 "decode latency" column: 1.1x for the LRT at 1x depth) and the real train step's time for
P = 1..4 refinement passes next to its counted FLOPs.

Both models are the `lrt` architecture built from configs/lrt_nanochat.py (the paper's recipe: nanochat
MoE backbone, MuonAdamW) on the preset's backbone; the vanilla one is `lrt.feedback="none"`, which is
exactly the plain backbone through the same code path (one pass, no feedback parameters).
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from t2mlr_jax.architectures import lrt
from t2mlr_jax.config_utils import backbone_preset, set_path
from t2mlr_jax.model.backbone import init_cache
from t2mlr_jax.model.config import ModelConfig, nanochat
from t2mlr_jax.model.generate import generate_with
from t2mlr_jax.model.recurrence import make_layout
from t2mlr_jax.model.spec import count_specs
from t2mlr_jax.train.init_from import architecture
from t2mlr_jax.train.optimizer import make_optimizer, make_schedule
from t2mlr_jax.train.train_step import compile_step, init_state

from .flops import jaxpr_matmul_flops, xla_flops
from .harness import measure_interleaved, median, median_ratio, progress, random_tokens
from .report import describe, markdown_table, ms, times

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "lrt_nanochat.py"
PAPER_DECODE_RATIO = 1.1  # Table 1, LRT at 1x depth: mean of the 16L and 20L latencies over vanilla
PASSES = (1, 2, 3, 4)  # the paper's refinement passes P ...
PASS_PROBS = (0.4, 0.3, 0.2, 0.1)  # ... and their training probabilities: E[P] = 2.0
VANILLA, LRT = "vanilla", "LRT"
# LLVM unoptimised: an initialisation compiles in ~1 s on a CPU instead of ~10 s.
FAST_COMPILE = (("xla_backend_optimization_level", 0),)


@dataclasses.dataclass(frozen=True)
class LRTPreset:
    model: ModelConfig  # the backbone both models share
    repeats: int
    decode_batch: int
    prompt_len: int
    new_tokens: int
    train_batch: int  # rows per step
    train_seq: int
    grad_accum: int = 1
    passes: tuple[int, ...] = PASSES
    pass_probs: tuple[float, ...] = PASS_PROBS
    paper_shapes: bool = False  # the paper's own backbone and protocol: show its figure beside ours
    # XLA options of the timed programs; the test preset compiles unoptimised (its timings mean nothing).
    compiler_options: tuple[tuple[str, object], ...] = ()


PRESETS = {
    # Test-sized: seconds, compile-bound.
    "test": LRTPreset(
        model=nanochat(
            2,
            seq_len=32,
            width=32,
            head_dim=16,
            vocab_size=64,
            moe_experts=4,
            gate_channels=8,
            dtype="float32",
        ),
        repeats=1,
        decode_batch=2,
        prompt_len=4,
        new_tokens=4,
        train_batch=2,
        train_seq=16,
        passes=(2,),  # one LRT step beside vanilla: every compile is ~5-10 s on a busy CPU
        pass_probs=(1.0,),
        compiler_options=FAST_COMPILE,
    ),
    # CPU-sized nanochat (4 layers, d 128, MoE 8+1 experts, vocab 4096), fp32; 1/16 of the paper's prompt,
    # 1/8 of its new tokens, and many short rounds: a shared CPU's noise comes in bursts of seconds.
    "quick": LRTPreset(
        model=nanochat(4, seq_len=256, width=128, head_dim=64, vocab_size=4096, dtype="float32"),
        repeats=10,
        decode_batch=8,
        prompt_len=64,
        new_tokens=128,
        train_batch=8,
        train_seq=128,
    ),
    # The paper's 16-layer reference (0.80B, bf16 compute; fp32 master weights for training, bf16 weights
    # for serving) and its latency protocol: batch 128, 1024 prompt + 1024 generated tokens.
    "full": LRTPreset(
        model=nanochat(16, seq_len=2048),
        repeats=3,
        decode_batch=128,
        prompt_len=1024,
        new_tokens=1024,
        train_batch=16,
        train_seq=2048,
        grad_accum=2,
        paper_shapes=True,
    ),
}


def load_config(model: ModelConfig, feedback: str, p: LRTPreset) -> ml_collections.ConfigDict:
    """configs/lrt_nanochat.py (the paper's recipe) on `model`, with `feedback` and the preset's step."""
    spec = importlib.util.spec_from_file_location("lrt_nanochat", CONFIG)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    for path, value in backbone_preset(model).items():
        set_path(config, path, value)
    config.lrt.feedback = feedback
    config.lrt.passes, config.lrt.pass_probs = tuple(p.passes), tuple(p.pass_probs)
    config.data.seq_len = p.train_seq
    config.train.batch_size, config.train.grad_accum = p.train_batch, p.grad_accum
    config.optimizer.batch_tokens = p.train_batch * p.train_seq
    return config


def describe_models(p: LRTPreset) -> dict:
    specs = {f: architecture(load_config(p.model, f, p), "lrt").specs for f in ("both", "none")}
    return {
        "backbone": describe(p.model),
        "lrt_params": count_specs(specs["both"]),
        "vanilla_params": count_specs(specs["none"]),
    }


def untimed(fn):
    """fn() jitted; compiled unoptimised on CPUs, where optimising an initialisation takes ~10 s."""
    options = dict(FAST_COMPILE) if jax.default_backend() == "cpu" else None
    return jax.jit(fn).lower().compile(options)()


class Program:
    """A compiled function of fixed arguments; calling it runs it once."""

    def __init__(self, fn, *args, options: tuple = ()):
        self.args = args
        self.compiled = jax.jit(fn).lower(*args).compile(dict(options))

    def __call__(self):
        return self.compiled(*self.args)


# --- decode ---------------------------------------------------------------------------------------------


def serving_decoder(p: LRTPreset, feedback: str) -> tuple[lrt.LRTDecoder, dict, dict]:
    """The architecture's decoder (dropless MoE, as its generate() uses), with weights stored in the
    compute dtype as served, and fresh parameters / model state."""
    model = p.model.replace(param_dtype=p.model.dtype)
    arch = architecture(load_config(model, feedback, p), "lrt")
    backbone = arch.backbone
    if backbone.mlp == "moe":
        backbone = backbone.replace(moe_capacity_factor=None)
    decoder = lrt.LRTDecoder(lrt.LRTConfig(backbone, feedback, False))
    return decoder, untimed(lambda: arch.init(jax.random.PRNGKey(0))), arch.init_model_state()


def decode_programs(p: LRTPreset, feedback: str, seed: int) -> tuple[Program, Program, float]:
    """generate_with (prefill + new_tokens greedy tokens) and its prefill alone, on the same cache size, so
    that their difference is the new_tokens - 1 cached decode steps; and one decode step's counted
    matmul FLOPs (the jaxpr of decoder.step at that cache size)."""
    decoder, params, model_state = serving_decoder(p, feedback)
    prompt = random_tokens(p.model, p.decode_batch, p.prompt_len, seed)
    mask = jnp.ones_like(prompt)
    cache_len = p.prompt_len + p.new_tokens

    def generate(weights, prompt, mask):
        return generate_with(decoder, weights, prompt, mask, max_new_tokens=p.new_tokens).tokens

    def prefill(weights, prompt, mask):
        cache = init_cache(decoder.model, p.decode_batch, cache_len)
        out = decoder.prefill(weights, prompt, make_layout(prompt, segment_ids=mask), cache)
        return jnp.argmax(out.logits[:, -1], axis=-1), out.recurrent_state, out.cache

    def step(weights, prompt):
        b, model = p.decode_batch, decoder.model
        tokens = prompt[:, -1:]
        memory = jnp.zeros((b, model.hidden_size), model.dtype)
        layout = make_layout(tokens, positions=jnp.full((b, 1), p.prompt_len, jnp.int32))
        return decoder.step(weights, tokens, memory, init_cache(model, b, cache_len), layout).logits

    weights, options = (params, model_state), p.compiler_options
    return (
        Program(generate, weights, prompt, mask, options=options),
        Program(prefill, weights, prompt, mask, options=options),
        jaxpr_matmul_flops(jax.jit(step).trace(weights, prompt).jaxpr),
    )


def decode(p: LRTPreset, seed: int) -> dict:
    steps = p.new_tokens - 1
    names = {VANILLA: "none", LRT: "both"}
    with progress("decode", 2 * len(names) * (p.repeats + 2)) as bar:
        runners, flops = {}, {}
        for name, feedback in names.items():
            runners[name], runners[f"{name} prefill"], flops[name] = decode_programs(p, feedback, seed)
            bar.update(2)
        seconds = measure_interleaved(runners, p.repeats, bar)
    per_token = {
        name: list((np.asarray(seconds[name]) - np.asarray(seconds[f"{name} prefill"])) / max(steps, 1))
        for name in names
    }
    rows = []
    for name in names:
        rows.append(
            {
                "variant": name,
                "feedback": names[name],
                "batch": p.decode_batch,
                "prompt_len": p.prompt_len,
                "new_tokens": p.new_tokens,
                "generate_seconds": median(seconds[name]),
                "prefill_seconds": median(seconds[f"{name} prefill"]),
                "decode_seconds_per_token": median(per_token[name]),
                "generate_seconds_per_new_token": median(seconds[name]) / p.new_tokens,
                "ratio": median_ratio(per_token[name], per_token[VANILLA]),
                "generate_ratio": median_ratio(seconds[name], seconds[VANILLA]),
                "step_flops": flops[name],
                "flop_ratio": flops[name] / flops[VANILLA],
                "paper_ratio": PAPER_DECODE_RATIO if p.paper_shapes and name == LRT else None,
                "generate_seconds_all": seconds[name],
                "prefill_seconds_all": seconds[f"{name} prefill"],
            }
        )
    table = markdown_table(
        [
            "model",
            "generate ms",
            "prefill ms",
            "decode ms/token",
            "decode ratio",
            "generate ratio",
            "FLOP ratio (step)",
            "paper (decode latency)",
        ],
        [
            [
                r["variant"],
                ms(r["generate_seconds"]),
                ms(r["prefill_seconds"]),
                f"{1e3 * r['decode_seconds_per_token']:.3f}",
                times(r["ratio"]),
                times(r["generate_ratio"]),
                times(r["flop_ratio"]),
                times(r["paper_ratio"], 1),
            ]
            for r in rows
        ],
    )
    notes = [
        f"Greedy generate_with(LRTDecoder) from a {p.prompt_len}-token prompt, {p.new_tokens} new tokens, "
        f"batch {p.decode_batch}, weights in {p.model.dtype}; MoE dropless (moe_capacity_factor=None) as "
        "the architecture decodes. Vanilla = lrt.feedback=none: the plain backbone through the same code.",
        f"decode ms/token = (generate - prefill) / {steps}: the prefill program is the decoder's own "
        "prefill on the same cache size, timed in the same interleaved rounds; ratios are medians of the "
        "per-round ratios. generate ratio includes the prefill, which is the token-by-token exact "
        "recurrence for both models here (a vanilla server would prefill in parallel). FLOP ratio (step): "
        "the matmul FLOPs of one decode step (jaxpr dot_generals, attention over the whole cache).",
        f"Paper (Table 1, LRT 1x depth): {PAPER_DECODE_RATIO}x, the mean of its 16L and 20L latencies over "
        "vanilla (H100, bf16, FlashAttention-3, batch 128, 1024 + 1024 tokens); shown next to the full "
        "preset only.",
    ]
    return {"rows": rows, "markdown": table, "notes": notes}


# --- train ----------------------------------------------------------------------------------------------


def lm_batch(vocab_size: int, batch: int, seq: int, seed: int) -> dict:
    """A packed-LM batch of the batch contract: one document per row, next-token targets."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, vocab_size, size=(batch, seq + 1), dtype=np.int32)
    flow = np.full((batch, seq), 2, np.int32)
    flow[:, 0] = 1
    return {
        "tokens": jnp.asarray(tokens[:, :-1]),
        "targets": jnp.asarray(tokens[:, 1:]),
        "loss_mask": jnp.ones((batch, seq), jnp.float32),
        "positions": jnp.broadcast_to(jnp.arange(seq, dtype=jnp.int32), (batch, seq)),
        "segment_ids": jnp.ones((batch, seq), jnp.int32),
        "control_flow": jnp.asarray(flow),
    }


class Model:
    """One architecture with the recipe's optimizer and its initial train state, shared by its steps."""

    def __init__(self, config: ml_collections.ConfigDict, seed: int):
        self.config = config
        self.arch = architecture(config, "lrt")
        steps = config.train.steps
        self.optimizer = make_optimizer(config.optimizer, self.arch.specs, steps)
        self.schedule = make_schedule(config.optimizer, steps)
        self.state = untimed(lambda: init_state(self.arch, self.optimizer, seed))
        params = self.state.params
        update = jax.jit(self.optimizer.update).trace(params, self.state.opt_state, params)
        self.optimizer_flops = jaxpr_matmul_flops(update.jaxpr)  # the optimizer update's own count


class TrainStep:
    """train_step.compile_step of a model (Muon, state donated) for one pass count, a copy of its state,
    and the step's counted FLOPs (jaxpr dot_generals)."""

    def __init__(self, model: Model, passes: int | None, batch: dict, options: tuple = ()):
        self.state = jax.tree.map(jnp.copy, model.state)  # each step donates its own
        self.batch = batch
        self.optimizer_flops = model.optimizer_flops
        step = compile_step(
            model.arch, model.optimizer, model.schedule, model.config.train.grad_accum, sample=passes
        )
        traced = step.trace(self.state, batch)
        self.flops = jaxpr_matmul_flops(traced.jaxpr)
        self.compiled = traced.lower().compile(dict(options))
        self.flops_xla = xla_flops(self.compiled)

    def __call__(self):
        self.state, metrics = self.compiled(self.state, self.batch)
        return metrics["loss"]


def train(p: LRTPreset, seed: int) -> dict:
    batch = lm_batch(p.model.vocab_size, p.train_batch, p.train_seq, seed + 1)
    cases = {VANILLA: ("none", None), **{f"{LRT} P={n}": ("both", n) for n in p.passes}}
    with progress("train", len(cases) * (p.repeats + 2)) as bar:
        models = {f: Model(load_config(p.model, f, p), seed) for f in ("none", "both")}
        runs = {}
        for name, (feedback, passes) in cases.items():
            runs[name] = TrainStep(models[feedback], passes, batch, p.compiler_options)
            bar.update()
        del models
        seconds = measure_interleaved(runs, p.repeats, bar)
    base = runs[VANILLA]
    rows = []
    for name, (_, passes) in cases.items():
        run = runs[name]
        time_ratio = median_ratio(seconds[name], seconds[VANILLA])
        flop_ratio = run.flops / base.flops
        rows.append(
            {
                "variant": name,
                "passes": passes or 1,
                "probability": None if passes is None else p.pass_probs[p.passes.index(passes)],
                "seconds": median(seconds[name]),
                "seconds_all": seconds[name],
                "time_ratio": time_ratio,
                "flops": run.flops,
                "optimizer_flops": run.optimizer_flops,
                "flops_xla": run.flops_xla,
                "flop_ratio": flop_ratio,
                "model_flop_ratio": (run.flops - run.optimizer_flops) / (base.flops - base.optimizer_flops),
                "flop_ratio_xla": _ratio(run.flops_xla, base.flops_xla),
                "time_over_flop_ratio": time_ratio / flop_ratio,
            }
        )
    expected = expected_row(p, rows, seconds)
    table = markdown_table(
        [
            "model",
            "P",
            "Pr(P)",
            "step ms",
            "time ratio",
            "FLOP ratio (step)",
            "FLOP ratio (fwd+bwd)",
            "FLOP ratio (XLA)",
            "time / FLOP ratio",
        ],
        [
            [
                r["variant"],
                r["passes"],
                "—" if r["probability"] is None else f"{r['probability']:g}",
                ms(r["seconds"]),
                times(r["time_ratio"]),
                times(r["flop_ratio"]),
                times(r["model_flop_ratio"]),
                times(r["flop_ratio_xla"]),
                f"{r['time_over_flop_ratio']:.3f}",
            ]
            for r in [*rows, expected]
        ],
    )
    notes = [
        f"The real train step (train_step.compile_step: grad over {p.grad_accum} micro-batch(es), MuonAdamW "
        f"of configs/lrt_nanochat.py, state donated), batch {p.train_batch} x {p.train_seq} tokens, "
        f"{p.model.dtype} compute, fp32 weights; the LRT's loss averaged over its P passes with gradients "
        "through every pass (lrt.supervise=all). Vanilla: lrt.feedback=none, one pass.",
        "FLOPs are counted from the traced step: the dot_generals of its jaxpr (scan bodies times their "
        "trip count). step: the whole step, Muon's Newton-Schulz included; fwd+bwd: minus the optimizer "
        "update's own count (the same Muon update for both models up to the LRT's feedback weights). XLA: "
        "compiled.cost_analysis()['flops'], which counts each loop body (the layer scan) once, so it is "
        "no cross-check.",
        f"E[P]: the expected step under P ~ {dict(zip(p.passes, p.pass_probs))} (E[P] = "
        f"{expected['passes']:g}): time ratio = median over rounds of sum_P Pr(P) t_P / t_vanilla; FLOP "
        "ratios likewise from the counts.",
    ]
    return {"rows": rows, "expected": expected, "markdown": table, "notes": notes}


def expected_row(p: LRTPreset, rows: list[dict], seconds: dict) -> dict:
    """The step cost expected under the pass distribution, from the measured and counted per-P rows."""
    by_passes = {r["passes"]: r for r in rows if r["probability"] is not None}
    base = rows[0]
    weights = dict(zip(p.passes, p.pass_probs))
    per_round = sum(w * np.asarray(seconds[by_passes[n]["variant"]]) for n, w in weights.items())
    time_ratio = median_ratio(list(per_round), seconds[base["variant"]])
    flops = sum(w * by_passes[n]["flops"] for n, w in weights.items())
    model = sum(w * (by_passes[n]["flops"] - by_passes[n]["optimizer_flops"]) for n, w in weights.items())
    xla = [by_passes[n]["flops_xla"] for n in weights]
    flops_xla = sum(w * x for w, x in zip(weights.values(), xla)) if all(xla) else None
    return {
        "variant": f"{LRT} E[P]",
        "passes": float(sum(n * w for n, w in weights.items())),
        "probability": None,
        "seconds": median(per_round),
        "time_ratio": time_ratio,
        "flop_ratio": flops / base["flops"],
        "model_flop_ratio": model / (base["flops"] - base["optimizer_flops"]),
        "flop_ratio_xla": _ratio(flops_xla, base["flops_xla"]),
        "time_over_flop_ratio": time_ratio / (flops / base["flops"]),
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


# name -> (title on the page, run(preset, seed) -> {"rows", "markdown", "notes", ...})
SECTIONS = {
    "decode": ("Decode: LRT vs vanilla (Table 1 decode latency)", decode),
    "train": ("Train step: P refinement passes vs vanilla, time and counted FLOPs", train),
}
