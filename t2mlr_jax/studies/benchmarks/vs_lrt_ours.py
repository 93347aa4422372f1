"""Our side of `experiments/vs_release.py --release lrt`, in a process of its own: the release's GPTs at
GPT (nanochat's GPTConfig fields, the rest at the release's defaults) as we import them
(formats.nanochat.model_config_from_nanochat: the nanochat backbone, dense relu² MLP, fp32), on
configs/lrt_nanochat.py's recipe (MuonAdamW), blocks' weights held per layer (model.scan_layers=False):
  lrt    arch "lrt" (feedback both: residual, K and V) on the recurrent GPT's backbone (init value
         embeddings on every layer); its train step is the release's training, lrt.training=interleaved:
         one full pass then PASSES interleaved passes over 1 / PASSES of the positions each, the loss
         the mean of the passes' (the release's own step, matched number for number by
         tools/release_parity.py); its decode is our cached generate, the exact recurrence a token at a
         time with the prefill's too
  plain  arch "transformer" on the vanilla GPT's backbone (value embeddings on alternating layers)
each timed through the trainer's own compiled step and the architecture's cached generate, compiled
ahead of time (vs_release_ours.py's `measure`); prints one JSON line.

  python -m experiments.benchmarks.vs_lrt_ours '<spec json>'
"""

from __future__ import annotations

from t2mlr_jax.studies import ROOT
from t2mlr_jax.studies.benchmarks.vs_release_ours import measure_all

ENTRY_POINT = "experiments.benchmarks.vs_lrt_ours"  # its command: python -m ENTRY_POINT
CONFIG = "configs/lrt_nanochat.py"
TITLE = "LRT: this framework vs the authors' release (OoDBag/Latent_recurrent_transformer)"
MODELS = {"lrt": "LRT", "plain": "vanilla"}  # row prefix -> label
# 4 layers x 256 (2 heads of 128, as nanochat's), windows SSSL of 128 / 256, an 8192-token vocabulary: a
# round of both sides in about a minute on 2 CPUs (the release's d12 takes minutes a step there).
GPT = {
    "sequence_len": 256,
    "vocab_size": 8192,
    "n_layer": 4,
    "n_head": 2,
    "n_kv_head": 2,
    "n_embd": 256,
    "window_pattern": "SSSL",
}
PASSES = 2  # the release's default interleaved_num_passes, on both sides
TRAIN = {"batch": 1, "seq_len": 256}
DECODE = {"batch": 1, "prompt_len": 16}  # batch 1: the release's Engine prefills one prompt


def model_spec() -> dict:
    return {"model": GPT, "passes": PASSES}


def setting(spec: dict) -> str:
    m = spec["model"]
    return (
        f"nanochat GPT, {m['n_layer']} layers x {m['n_embd']}, {m['n_head']} heads, vocab "
        f"{m['vocab_size']}, windows {m['window_pattern']} of context {m['sequence_len']}; "
        f"interleaved training with {spec['passes']} interleaved passes on both sides (ours: "
        "lrt.training=interleaved); MuonAdamW on both sides"
    )


def details(spec: dict) -> dict[str, str]:
    t, d, p = spec["train"], spec["decode"], spec["passes"]
    return {
        "lrt_train": f" (fwd + bwd + Muon, {t['batch']} × {t['seq_len']} tokens; both: a full pass + {p} "
        f"interleaved passes of 1/{p} of the positions)",
        "plain_train": " (the release's vanilla GPT / our transformer on its backbone)",
        "lrt_decode": f", batch {d['batch']}, {d['prompt_len']}-token prompt + {d['new_tokens']} new, exact "
        "recurrence a token per forward, prompt included (tok/s)",
        "plain_decode": " (release: Engine.generate; tok/s)",
    }


def config(spec: dict, interleaved: bool):
    """configs/lrt_nanochat.py on the spec's GPT as we import it (the recurrent GPT's when `interleaved`,
    trained as the release trains it: lrt.training=interleaved over the spec's passes), its train batch."""
    from configs.recipes import backbone_preset
    from t2mlr_jax.config.edit import config_module, set_path
    from t2mlr_jax.formats.nanochat import model_config_from_nanochat

    c = config_module(ROOT / CONFIG).get_config()
    model = model_config_from_nanochat({**spec["model"], "use_interleaved": interleaved})
    for path, value in backbone_preset(model).items():
        set_path(c, path, value)
    c.model.scan_layers = False
    c.lrt.feedback, c.lrt.training, c.lrt.interleaved_num_passes = "both", "interleaved", spec["passes"]
    t = spec["train"]
    c.data.seq_len = t["seq_len"]
    c.train.batch_size, c.train.grad_accum = t["batch"], 1
    c.optimizer.muon.batch_tokens = t["batch"] * t["seq_len"]
    return c


def models_of(spec: dict) -> dict:
    return {"lrt": (config(spec, True), "lrt", 1), "plain": (config(spec, False), "transformer", 1)}


def main(spec: dict) -> dict:
    """{"side", "versions", "programs", "peak_rss_bytes", "wall_s"}; programs: lrt_train, lrt_decode,
    plain_train, plain_decode, each {"seconds": [...], "compile_s", "params", ...}."""
    return measure_all(spec, models_of)
