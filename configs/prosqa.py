"""ProsQA-Hard (paper Section 4.2: ~60 concepts, proofs of ~8 steps): SmolLM2-135M T²MLR, code l_start 1,
D=8, B=4, the release's script: LR 5e-4, AdamW (0.9, 0.99), wd 0.01, 5% warmup, cosine to 1%, batch 128;
examples generated on the fly; greedy generation, scored as a valid shortest proof with the right answer.
Presets: baseline, cpu (small graphs)."""

from t2mlr_jax.config_utils import finetuning


def get_config(arg=None):
    return finetuning(
        "prosqa",
        l_start=1,
        d_forward=8,
        d_backward=4,
        data=dict(kind="generated", task="prosqa", seq_len=1024, eval_split="test"),
        optimizer=dict(lr=5e-4, b2=0.99, weight_decay=0.01, warmup_ratio=0.05, min_lr_ratio=0.01),
        train=dict(
            steps=2000, batch_size=128, grad_accum=8, log_every=50, eval_every=500, checkpoint_every=500
        ),
        evaluation=dict(batch_size=32, num_examples=500, max_new_tokens=192),
        cpu={
            "data.seq_len": 256,
            "data.options.min_concepts": 12,
            "data.options.max_concepts": 14,
            "data.options.min_path": 3,
            "data.options.max_path": 4,
            "eval.max_new_tokens": 48,
            "train.steps": 10,
        },
        arg=arg,
    )
