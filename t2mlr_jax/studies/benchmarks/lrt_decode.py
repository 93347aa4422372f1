"""The decode section of experiments/bench_lrt.py: generation time per token, LRT (feedback=both) over
vanilla (feedback=none), next to one decode step's counted FLOPs and the paper's Table 1 ratio."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from t2mlr_jax.architectures import build_architecture
from t2mlr_jax.architectures.lrt import forward as lrt_forward
from t2mlr_jax.experiment import resolve
from t2mlr_jax.model.backbone import init_cache
from t2mlr_jax.model.generate import generate_with
from t2mlr_jax.model.token_layout import make_layout
from t2mlr_jax.studies.benchmarks.flops import jaxpr_matmul_flops
from t2mlr_jax.studies.benchmarks.harness import (
    measure_interleaved,
    median,
    median_ratio,
    progress,
    random_tokens,
)
from t2mlr_jax.studies.benchmarks.lrt import LRT, PAPER_DECODE_RATIO, VANILLA, LRTPreset, load_config, untimed
from t2mlr_jax.studies.benchmarks.report import markdown_table, ms, times


class Program:
    """A compiled function of fixed arguments; calling it runs it once."""

    def __init__(self, fn, *args, options: tuple = ()):
        self.args = args
        self.compiled = jax.jit(fn).lower(*args).compile(dict(options))

    def __call__(self):
        return self.compiled(*self.args)


def serving_decoder(p: LRTPreset, feedback: str) -> tuple[lrt_forward.LRTDecoder, dict, dict]:
    """The architecture's decoder (dropless MoE, as its generate() uses), with weights stored in the
    compute dtype as served, and fresh parameters / model state."""
    model = p.model.replace(param_dtype=p.model.dtype)
    arch = build_architecture(resolve(load_config(model, feedback, p)), "lrt")
    backbone = arch.backbone
    if backbone.mlp == "moe":
        backbone = backbone.replace(moe_capacity_factor=None)
    decoder = lrt_forward.LRTDecoder(lrt_forward.LRTConfig(backbone, feedback, False))
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
