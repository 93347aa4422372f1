"""The LRT against its vanilla backbone (experiments/bench_lrt.py): decode time per token (the paper's
Table 1 "decode latency" column: 1.1x for the LRT at 1x depth), the real train step's time for
P = 1..4 refinement passes next to its counted FLOPs, and the decode time per vocabulary token of every
row of Table 1 (configs/lrt_comparison.py) over the 1x vanilla transformer, next to the paper's column.

The decode and train models are the `lrt` architecture built from configs/lrt_nanochat.py (the paper's
recipe: nanochat MoE backbone, MuonAdamW) on the preset's backbone; the vanilla one is
`lrt.feedback="none"`, which is exactly the plain backbone through the same code path (one pass, no
feedback parameters). The rows are each built by its own architecture (lrt, looped, ponderlm2).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from t2mlr_jax.architectures import lrt
from t2mlr_jax.config_utils import backbone_preset, config_module, set_path
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
COMPARISON = CONFIG.with_name("lrt_comparison.py")  # every row of the paper's comparison
PAPER_DECODE_RATIO = 1.1  # Table 1, LRT at 1x depth: mean of the 16L and 20L latencies over vanilla
# Table 1's decode latency of each row over the 1x transformer (its 16L / 20L mean), the rows' order.
PAPER_ROW_RATIOS = {
    "vanilla1x": 1.0,
    "vanilla2x": 2.0,
    "vanilla3x": 3.0,
    "loop2": 2.0,
    "loop3": 3.0,
    "loop4": 3.9,
    "lrt1x": 1.1,
    "lrt2x": 2.2,
    "lrt3x": 3.3,
    "tt1": 2.3,
    "tt2": 3.4,
    "ponder1": 2.1,
    "ponder2": 3.1,
}
TABLE1_ROWS = tuple(PAPER_ROW_RATIOS)
BASELINE_ROW = "vanilla1x"  # every row's ratio is over it
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
    passes: tuple[int, ...] = lrt.PASSES  # the paper's refinement passes P ...
    pass_probs: tuple[float, ...] = lrt.PASS_PROBS  # ... and their training probabilities: E[P] = 2.0
    paper_shapes: bool = False  # the paper's own backbone and protocol: show its figure beside ours
    # XLA options of the timed programs; the test preset compiles unoptimised (its timings mean nothing).
    compiler_options: tuple[tuple[str, object], ...] = ()
    # The rows section: rows of configs/lrt_comparison.py (vanilla1x, the baseline, always), built at
    # its scale `rows_scale` (cpu | paper) on this backbone; each generates rows_new_tokens from a
    # one-token prompt (None: prompt_len + new_tokens, the decode section's context).
    rows: tuple[str, ...] = TABLE1_ROWS
    rows_scale: str = "cpu"
    rows_new_tokens: int | None = None


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
        # One LRT step (pass 0 + 1 refinement) beside vanilla: each compile is ~5-10 s on a busy CPU.
        passes=(1,),
        pass_probs=(1.0,),
        compiler_options=FAST_COMPILE,
        # One row of each decoding kind: plain, feedback, thought slots with and without feedback, looped.
        rows=("vanilla1x", "lrt1x", "tt1", "ponder1", "loop2"),
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
        # 13 rows, ~40x vanilla's decode work per round: short generations (the run: a few minutes).
        rows_new_tokens=32,
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
        rows_scale="paper",
    ),
}


def load_config(model: ModelConfig, feedback: str, p: LRTPreset) -> ml_collections.ConfigDict:
    """configs/lrt_nanochat.py (the paper's recipe) on `model`, with `feedback` and the preset's step."""
    config = config_module(CONFIG).get_config()
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
    """train_step.compile_step of a model (Muon, state donated) for one pass count (None: the model's
    only step, vanilla's), a copy of its state, and the step's counted FLOPs (jaxpr dot_generals)."""

    def __init__(self, model: Model, passes: int | None, batch: dict, options: tuple = ()):
        self.state = jax.tree.map(jnp.copy, model.state)  # each step donates its own
        self.batch = batch
        self.optimizer_flops = model.optimizer_flops
        draw = None if passes is None else lrt.Draw(thoughts=0, passes=passes)  # the plain LRT: K = 0
        step = compile_step(
            model.arch, model.optimizer, model.schedule, model.config.train.grad_accum, sample=draw
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
                "passes": passes or 0,  # refinement passes: vanilla runs pass 0 only
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
        f"{p.model.dtype} compute, fp32 weights; the LRT's loss averaged over its 1 + P passes (pass 0 and "
        "P refinements) with gradients through every pass (lrt.supervise=all). Vanilla: "
        "lrt.feedback=none, one pass.",
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


# --- rows -----------------------------------------------------------------------------------------------

PAD_ID = 0  # never written: no EOS, every row generates all its tokens


@functools.cache
def comparison():
    """configs/lrt_comparison.py as a module (its ROWS and get_config)."""
    return config_module(COMPARISON)


def row_config(name: str, p: LRTPreset) -> ml_collections.ConfigDict:
    """Row `name` of configs/lrt_comparison.py at p.rows_scale, on the preset's backbone scaled as the
    comparison scales its reference (depth x the row's, rows and context x its slots), with the weights
    stored in the compute dtype as served. At the full preset the backbone is the paper scale's own."""
    row = comparison().ROWS[name]
    config = comparison().get_config(f"{name},{p.rows_scale}")
    model = p.model.replace(param_dtype=p.model.dtype)
    for path, value in backbone_preset(model).items():
        set_path(config, path, value)
    config.model.num_layers = model.num_layers * row.depth
    config.model.max_seq_len = config.data.seq_len = row.slots * model.max_seq_len
    config.data.eval_seq_len = model.max_seq_len
    return config


def _jaxprs(value):
    if hasattr(value, "eqns"):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _jaxprs(item)


def decode_loop(jaxpr) -> tuple[float, tuple[int, ...]] | None:
    """The token loop of a traced generate (the while loop carrying the KV cache): one decode step's
    matmul FLOPs (its body) and the cache's shape [L, B, S, K, E]."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "while":
            carry = eqn.invars[eqn.params["cond_nconsts"] + eqn.params["body_nconsts"] :]
            caches = [v.aval.shape for v in carry if v.aval.ndim == 5]
            if caches:
                return jaxpr_matmul_flops(eqn.params["body_jaxpr"]), caches[0]
        for value in eqn.params.values():
            for inner in _jaxprs(value):
                found = decode_loop(inner)
                if found is not None:
                    return found
    return None


class RowDecode:
    """One row's architecture (init_from.architecture) with fresh params and model state, its generate
    jitted as evaluate_generation jits it (new_tokens, eos_id, pad_id static) and compiled; calling it
    generates once. The traced program says what one token costs: the cache the token loop carries
    ([L, B, S, K, E]: L decode layers, S / context slots per vocabulary token) and the loop body's FLOPs."""

    def __init__(self, config, prompt, mask, new_tokens: int, seed: int, options: tuple = ()):
        arch = architecture(config, config.arch)
        self.num_params = arch.num_params()
        params = untimed(lambda: arch.init(jax.random.PRNGKey(seed)))
        self.args = (params, arch.init_model_state(), prompt, mask, None)
        generate = jax.jit(arch.generate, static_argnums=(5, 6, 7))
        traced = generate.trace(*self.args, new_tokens, None, PAD_ID)
        loop = decode_loop(traced.jaxpr)
        if loop is None:
            raise ValueError(f"{config.arch}.generate has no token loop carrying a KV cache")
        self.step_flops, cache = loop
        context = prompt.shape[1] + new_tokens
        if cache[2] % context:
            raise ValueError(f"a KV cache of {cache[2]} slots is no whole number per token of {context}")
        self.decode_layers, self.slots_per_token = cache[0], cache[2] // context
        self.compiled = traced.lower().compile(dict(options))

    def __call__(self):
        return self.compiled(*self.args).tokens


def rows(p: LRTPreset, seed: int) -> dict:
    names = (BASELINE_ROW, *(r for r in dict.fromkeys(p.rows) if r != BASELINE_ROW))
    new_tokens, repeats = p.rows_new_tokens or p.prompt_len + p.new_tokens, p.repeats
    # A one-token prompt: each of the new_tokens is one cached token forward (the prompt's prefill one of
    # them) on the same cache of (1 + new_tokens)(K + 1) slots, so generate / new_tokens is the decode.
    prompt = random_tokens(p.model, p.decode_batch, 1, seed)
    mask = jnp.ones_like(prompt)
    configs = {name: row_config(name, p) for name in names}
    runners, errors = {}, {}
    with progress("rows", len(names) * (repeats + 2)) as bar:
        for name, config in configs.items():
            try:
                runners[name] = RowDecode(config, prompt, mask, new_tokens, seed, p.compiler_options)
            except Exception as error:  # one row that cannot generate must not cost the others
                errors[name] = f"{type(error).__name__}: {str(error).splitlines()[0]}"
                print(f"rows: {name} cannot be measured: {errors[name]}", file=sys.stderr)
                bar.update(repeats + 1)
            bar.update()
        seconds = measure_interleaved(runners, repeats, bar)
    base = runners.get(BASELINE_ROW)
    table = []
    for name, config in configs.items():
        run, k = runners.get(name), comparison().decode_thoughts(config)
        measured = run is not None
        table.append(
            {
                "row": name,
                "label": comparison().ROWS[name].label,
                "arch": config.arch,
                "thoughts": k,
                "expected_blocks_per_token": comparison().decode_blocks(config),
                "decode_layers": run.decode_layers if measured else None,
                "slots_per_token": run.slots_per_token if measured else None,
                "blocks_per_token": run.decode_layers * run.slots_per_token if measured else None,
                "params": run.num_params if measured else None,
                "batch": p.decode_batch,
                "new_tokens": new_tokens,
                "generate_seconds": median(seconds[name]) if measured else None,
                "seconds_per_token": median(seconds[name]) / new_tokens if measured else None,
                "ratio": median_ratio(seconds[name], seconds[BASELINE_ROW]) if measured and base else None,
                "step_flops": run.step_flops if measured else None,
                "flop_ratio": run.step_flops / base.step_flops if measured and base else None,
                "paper_ratio": PAPER_ROW_RATIOS.get(name),
                "generate_seconds_all": seconds.get(name),
                "error": errors.get(name),
            }
        )
    markdown = markdown_table(
        [
            "row",
            "Table 1",
            "K",
            "decode blocks / token",
            "ms / token",
            "ratio (measured)",
            "FLOP ratio (step)",
            "paper (decode latency)",
        ],
        [
            [
                r["row"],
                r["label"],
                r["thoughts"],
                r["expected_blocks_per_token"] if r["blocks_per_token"] is None else r["blocks_per_token"],
                "—" if r["error"] else f"{1e3 * r['seconds_per_token']:.3f}",
                "failed" if r["error"] else times(r["ratio"]),
                times(r["flop_ratio"]),
                times(r["paper_ratio"], 1),
            ]
            for r in table
        ],
    )
    notes = [
        f"Each row is configs/lrt_comparison.py:<row>,{p.rows_scale} on this run's backbone "
        f"({p.model.num_layers} layers x the row's depth; the full preset's is the paper scale's own), "
        "built by init_from.architecture with fresh weights (compute dtype) and model state; timed: its "
        "arch.generate jitted as evaluate_generation jits it (greedy, no EOS), all rows interleaved in "
        f"each of {repeats} rounds, ratios the medians of the per-round ratios over {BASELINE_ROW}.",
        f"Batch {p.decode_batch}, a one-token random prompt and {new_tokens} new tokens: {new_tokens} "
        f"cached token forwards (the prompt's prefill is one), each on a cache of {1 + new_tokens}(K+1) "
        "slots; ms / token = generate / new tokens (the call's fixed overhead included, amortised). A "
        "thought row decodes K+1 slots per vocabulary token at K = eval.thoughts (default its largest "
        "trained K), a looped row each repeat of its blocks.",
        "decode blocks / token and the FLOP ratio are read off each traced program: the KV cache its "
        "token loop carries ([L, B, S, ...]: L layers x S / context slots per token) and the loop body's "
        "matmul FLOPs (one vocabulary token: every slot through every block, the head once).",
        "Paper: Table 1's decode latency over Transformer 1x (H100, bf16, batch 128, 1024 + 1024 tokens, "
        "its 16L / 20L mean); comparable with the full preset only (the paper's backbone and context): "
        "at CPU sizes the time per token is not the blocks' FLOPs (compare the FLOP ratio).",
        *(f"{name} failed to build or trace: {error}" for name, error in errors.items()),
    ]
    return {"rows": table, "markdown": markdown, "notes": notes}


# name -> (title on the page, run(preset, seed) -> {"rows", "markdown", "notes", ...})
SECTIONS = {
    "decode": ("Decode: LRT vs vanilla (Table 1 decode latency)", decode),
    "train": ("Train step: P refinement passes vs vanilla, time and counted FLOPs", train),
    "rows": ("Table 1 rows: decode time per vocabulary token over the 1x transformer", rows),
}
