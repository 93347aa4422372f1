"""The T²MLR text study's rows (experiments/t2mlr_study.py --parts=text): small-text pretraining on the
training plays through the studies' 512-token BPE (the study trains it: data.tokenizer), judged on The
Tempest and The Winter's Tale. Every choice was fixed before any row ran (issue 44's protocol):

- an 8-layer SmolLM2-shaped model, 24 wide (2 heads of 12, MLP 72), with a ~25% middle window (code
  l_start 3, l_end 4: the paper's (4, 5)), tied embeddings, 71k parameters (32 wide, 120k, would take
  the study past its hour on 2 cores);
- 256-token rows, 8 per step, TOKENS_PER_PARAM (20) training tokens per parameter (below one epoch of the
  4.65M-token training text);
- T²MLR trained with the Jacobi forward at D = 16, B = 4 (the paper's 135M recipe), evaluated both with the
  exact sequential recurrence and with the Jacobi forward; γ_rec starting at 0.1 (the release's
  rezero_gamma_recurrent_gate_init; the paper's 0 keeps the gate shut at CPU budgets, docs/studies.md);
- the release's AdamW recipe (0.9, 0.98), wd 0.01, 5% warmup, cosine to 1e-3 x peak, clipping at 1.0,
  its rate x one multiplier chosen by the rule (t2mlr_jax.studies.recipe_rule) on the parameter-matched
  transformer alone (SWEPT_LR_MULTIPLIER, docs/recipes.md) and halved while a probe of every row diverges
  (STABILITY_PROBES);
- 256 held-out rows of 256 tokens (65,536 tokens), bits per byte with nanochat's masking.

Presets: t2mlr (default) | transformer (parameter-matched, the baseline the rule sweeps). The data paths
are the raw plays; data.tokenizer must be given (the study's BPE):
  python -m experiments.lr_sweep --config=configs/t2mlr_text_study.py:transformer --study_vocab=512 ...
"""

from configs.recipes import shakespeare_split
from t2mlr_jax.config.edit import apply_preset, config_module, set_path
from t2mlr_jax.studies.recipe_rule import stable_multiplier

LAYERS, WIDTH, HEAD_DIM = 8, 24, 12
WINDOW = (3, 4)  # code l_start, l_end: the middle quarter of 8 layers
SEQ_LEN, BATCH, TOKENS_PER_PARAM = 256, 8, 20
T2MLR_PARAMS = 70_922  # the T²MLR row's parameters (the transformer is widened to them): they set the steps
STEPS = -(-TOKENS_PER_PARAM * T2MLR_PARAMS // (SEQ_LEN * BATCH))
BASE_LR = 3e-3
SWEPT_LR_MULTIPLIER = 4.0  # experiments/lr_sweep.py on the transformer preset (docs/recipes.md): 12e-3
STABILITY_PROBES = {4.0: 0}  # t2mlr_study --probe: 0 of its 12 runs (every row, seeds 100 and 101) diverged
VOCAB = 512


def get_config(arg=None):
    config = config_module(__file__.replace("t2mlr_text_study.py", "smollm135m_t2mlr.py")).get_config("cpu")
    train, heldout = shakespeare_split()
    settings = {
        "model.scan_layers": True,
        "model.num_layers": LAYERS,
        "model.hidden_size": WIDTH,
        "model.num_heads": WIDTH // HEAD_DIM,
        "model.num_kv_heads": 1,
        "model.head_dim": HEAD_DIM,
        "model.mlp_dim": 3 * WIDTH,
        "model.max_seq_len": SEQ_LEN,
        "model.vocab_size": VOCAB,
        "model.recurrence.l_start": WINDOW[0],
        "model.recurrence.l_end": WINDOW[1],
        "model.recurrence.d_forward": 16,
        "model.recurrence.d_backward": 4,
        "model.recurrence.gamma_recurrent_init": 0.1,
        "t2mlr.forward_mode": "jacobi",
        "data.tokenizer": "",
        "data.train_path": train,
        "data.eval_path": heldout,
        "data.seq_len": SEQ_LEN,
        "optimizer.lr": BASE_LR,
        "optimizer.lr_multiplier": stable_multiplier(SWEPT_LR_MULTIPLIER, STABILITY_PROBES),
        "optimizer.warmup_ratio": 0.05,
        "optimizer.grad_clip": 1.0,
        "train.steps": STEPS,
        "train.batch_size": BATCH,
        "train.log_every": 25,
        "train.checkpoint_every": 250,
        "train.keep_checkpoints": 1,
        "eval.num_examples": 256,
        "eval.batch_size": 64,
        "eval.bpb_masking": "nanochat",
        "eval.require_bpb": True,
    }
    for path, value in settings.items():
        set_path(config, path, value)
    config.name = "t2mlr_text_study"
    presets = {
        "t2mlr": {},
        # widened channel by channel: at 24 wide a step of 8 would add a third of the parameters
        "transformer": {"arch": "transformer", "baseline.param_match": True, "baseline.width_multiple": 1},
    }
    return apply_preset(config, arg or "t2mlr", presets)
