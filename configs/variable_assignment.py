"""Variable assignment, depth 5 (paper Section 4.2): SmolLM2-135M T²MLR, code l_start 1 (l_end -2), D=8,
B=4, the release's script: LR 5e-4, AdamW (0.9, 0.99), wd 0.01, 5% warmup, cosine to 1%, batch 256;
examples generated on the fly; greedy generation, exact match on the value.
Presets: baseline, cpu (see t2mlr_jax.config_utils.finetuning)."""

from t2mlr_jax.config_utils import finetuning


def get_config(arg=None):
    return finetuning(
        "variable_assignment",
        l_start=1,
        d_forward=8,
        d_backward=4,
        data=dict(
            kind="generated",
            task="variable_assignment",
            seq_len=512,
            eval_split="test",
            options=dict(depth=5),
        ),
        optimizer=dict(lr=5e-4, b2=0.99, weight_decay=0.01, warmup_ratio=0.05, min_lr_ratio=0.01),
        train=dict(
            steps=2000, batch_size=256, grad_accum=2, log_every=50, eval_every=500, checkpoint_every=500
        ),
        evaluation=dict(batch_size=64, num_examples=1000, max_new_tokens=8),
        cpu={"data.seq_len": 128, "eval.max_new_tokens": 4},
        arg=arg,
    )
