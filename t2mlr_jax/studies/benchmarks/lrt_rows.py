"""The rows section of experiments/bench_lrt.py: decode time per vocabulary token of each row of the paper's
Table 1 (configs/lrt_comparison.py), each built by its own architecture, over the 1x transformer."""

from __future__ import annotations

import functools
import sys

import jax
import jax.numpy as jnp
import ml_collections

from configs.recipes import backbone_preset
from t2mlr_jax.architectures import build_architecture
from t2mlr_jax.config.edit import config_module, set_path
from t2mlr_jax.experiment import resolve
from t2mlr_jax.studies.benchmarks.flops import jaxpr_matmul_flops
from t2mlr_jax.studies.benchmarks.harness import (
    measure_interleaved,
    median,
    median_ratio,
    progress,
    random_tokens,
)
from t2mlr_jax.studies.benchmarks.lrt import BASELINE_ROW, COMPARISON, PAPER_ROW_RATIOS, LRTPreset, untimed
from t2mlr_jax.studies.benchmarks.report import markdown_table, times

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
    config.eval.window = model.max_seq_len
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
    """One row's architecture (build_architecture) with fresh params and model state, its generate
    jitted as evaluate_generation jits it (new_tokens, eos_id, pad_id static) and compiled; calling it
    generates once. The traced program says what one token costs: the cache the token loop carries
    ([L, B, S, K, E]: L decode layers, S / context slots per vocabulary token) and the loop body's FLOPs."""

    def __init__(self, config, prompt, mask, new_tokens: int, seed: int, options: tuple = ()):
        arch = build_architecture(resolve(config), config.arch)
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
        "built by build_architecture with fresh weights (compute dtype) and model state; timed: its "
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
