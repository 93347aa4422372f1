"""Our side of `experiments/vs_release.py --release ponderlm2`, in a process of its own: the release's
llama_config/125m scaled down to LLAMA (4 layers x 256, 4 heads of 64, MLP 688 = 2064 x 256 / 768, its
50,304-token vocabulary, rms eps 0.1, untied) on CONFIG's Llama recipe (AdamW, clipped; fp32, blocks'
weights held per layer, no rematerialisation, as the release's script trains) with the release's optimizer
settings, as
  ponder  arch "ponderlm2", K = 1 thought, embeddings x sqrt(2.5 H) (the release's scale_embeds), P =
          jacobi_iterations + 1 refinement passes after the vocabulary-only pass 0, the loss at the last:
          the release's count (its initialisation pass, its Jacobi passes and its final pass); decode:
          K + 1 cached forwards per token
  plain   arch "transformer" on the same backbone (the release's vanilla is stock transformers Llama)
each timed through the trainer's own compiled step and the architecture's cached generate, compiled ahead
of time (vs_release_ours.measure); prints one JSON line.

  python -m experiments.benchmarks.vs_ponderlm2_ours '<spec json>'
"""

from __future__ import annotations

from t2mlr_jax.studies.benchmarks import vs_release_ours
from t2mlr_jax.studies.benchmarks.vs_release_ours import measure_all

ENTRY_POINT = "experiments.benchmarks.vs_ponderlm2_ours"  # its command: python -m ENTRY_POINT
CONFIG = vs_release_ours.CONFIG  # its Llama backbone and AdamW; T²MLR off
TITLE = "PonderLM-2: this framework vs the authors' release (LUMIA-Group/PonderLM-2)"
MODELS = {"ponder": "PonderLM-2", "plain": "plain Llama"}  # row prefix -> label
LLAMA = {  # llama_config/125m/config.json, 4 layers of width 256 instead of 12 of 768
    "vocab_size": 50304,
    "hidden_size": 256,
    "num_layers": 4,
    "num_heads": 4,
    "num_kv_heads": 4,
    "head_dim": 64,
    "mlp_dim": 688,
    "rope_theta": 10_000.0,
    "norm_eps": 0.1,
    "tie_embeddings": False,
    "init_std": 0.02,
    "max_seq_len": 2048,
}
# scripts/train_ponderlm2_llama_410m.sh's settings; 3 Jacobi iterations every step (the script: 2 or 3).
PONDER = {"thoughts": 1, "jacobi_iterations": 3, "embed_scale": True}
OPTIMIZER = {"lr": 3e-4, "grad_clip": 1.0, "b1": 0.9, "b2": 0.95, "eps": 1e-8, "weight_decay": 0.1}
TRAIN = {"batch": 1, "seq_len": 256}
DECODE = {"batch": 1, "prompt_len": 16}


def model_spec() -> dict:
    return {"model": LLAMA, "ponder": PONDER, "optimizer": OPTIMIZER}


def setting(spec: dict) -> str:
    m, p = spec["model"], spec["ponder"]
    return (
        f"Llama, {m['num_layers']} layers x {m['hidden_size']}, {m['num_heads']} heads, MLP {m['mlp_dim']}, "
        f"vocab {m['vocab_size']}; K = {p['thoughts']} thought, {p['jacobi_iterations']} Jacobi iterations "
        f"(ours: P = {p['jacobi_iterations'] + 1}), embeddings x sqrt(2.5 H); AdamW on both sides"
    )


def details(spec: dict) -> dict[str, str]:
    t, d, k = spec["train"], spec["decode"], spec["ponder"]["thoughts"]
    return {
        "ponder_train": f" (fwd + bwd + AdamW, {t['batch']} × {t['seq_len']} tokens)",
        "plain_train": " (same backbone: stock transformers Llama / our transformer)",
        "ponder_decode": f", batch {d['batch']}, {d['prompt_len']}-token prompt + {d['new_tokens']} new, "
        f"{k + 1} forwards per token (tok/s)",
        "plain_decode": " (tok/s)",
    }


def models_of(spec: dict) -> dict:
    c = vs_release_ours.config()
    c.model.update(spec["model"])
    c.model.remat = "none"  # the release's script: --disable_gradient_checkpointing true (CONFIG: "dots")
    c.model.recurrence.l_start = c.model.recurrence.l_end = 0  # CONFIG's T²MLR window, read by neither arch
    vs_release_ours.set_optimizer(c, spec["optimizer"])
    p = spec["ponder"]
    c.ponderlm2.thoughts, c.ponderlm2.embed_scale = (p["thoughts"],), p["embed_scale"]
    c.ponderlm2.passes, c.ponderlm2.pass_probs = (p["jacobi_iterations"] + 1,), (1.0,)
    # A row of our thought model holds seq_len / (K + 1) tokens: K + 1 times the release's row, its tokens.
    return {"ponder": (c, "ponderlm2", p["thoughts"] + 1), "plain": (c, "transformer", 1)}


def main(spec: dict) -> dict:
    """{"side", "versions", "programs", "peak_rss_bytes", "wall_s"}; programs: ponder_train, ponder_decode,
    plain_train, plain_decode, each {"seconds": [...], "compile_s", "params", ...}."""
    return measure_all(spec, models_of)
