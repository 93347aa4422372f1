"""The train section of experiments/bench_lrt.py: the real train step for each refinement pass count P over
vanilla, its time next to its counted FLOPs, and the step expected under the pass distribution."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from t2mlr_jax.architectures import build_architecture
from t2mlr_jax.architectures.lrt import architecture as lrt
from t2mlr_jax.experiment import resolve
from t2mlr_jax.studies.benchmarks.flops import jaxpr_matmul_flops, xla_flops
from t2mlr_jax.studies.benchmarks.harness import measure_interleaved, median, median_ratio, progress
from t2mlr_jax.studies.benchmarks.lrt import LRT, VANILLA, LRTPreset, load_config, untimed
from t2mlr_jax.studies.benchmarks.report import markdown_table, ms, times
from t2mlr_jax.train.optimizer import make_optimizer, make_schedule
from t2mlr_jax.train.train_step import compile_step, init_state


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
        self.arch = build_architecture(resolve(config), "lrt")
        steps = config.train.steps
        self.optimizer = make_optimizer(resolve(config).optimizer, self.arch.specs, steps)
        self.schedule = make_schedule(resolve(config).optimizer, steps)
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
