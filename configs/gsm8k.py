"""GSM8K-Aug finetuning (paper Section 4.3): SmolLM2-135M T²MLR with code l_start 4, D=16, B=8 and the
gate LR boosted x100, the release's script: LR 5e-4, AdamW (0.9, 0.99), wd 0.01, 3% warmup, cosine to 1%,
batch 256; 8000 steps (paper Table 14). Data: data.train_path / data.eval_path, GSM8K-Aug rows
{question, steps, answer} (JSONL/JSON/parquet); greedy generation, the answer after "###" compared.
Presets: baseline, cpu (configs/samples/gsm8k_aug.jsonl: 24 synthetic rows in that format, smoke only).
The release starts from a pretrained checkpoint: --config.init_from=<it> (a baseline from it also needs
--config.baseline.param_match=False)."""

from pathlib import Path

from t2mlr_jax.config_utils import finetuning

SAMPLE = str(Path(__file__).resolve().parent / "samples" / "gsm8k_aug.jsonl")


def get_config(arg=None):
    return finetuning(
        "gsm8k",
        l_start=4,
        d_forward=16,
        d_backward=8,
        data=dict(kind="file", format="gsm8k_aug", seq_len=1024),
        optimizer=dict(
            lr=5e-4,
            b2=0.99,
            weight_decay=0.01,
            warmup_ratio=0.03,
            min_lr_ratio=0.01,
            gate_lr_multiplier=100.0,
        ),
        train=dict(
            steps=8000, batch_size=256, grad_accum=4, log_every=20, eval_every=1000, checkpoint_every=1000
        ),
        evaluation=dict(batch_size=64, num_examples=1319, max_new_tokens=256),
        cpu={
            "data.train_path": SAMPLE,
            "data.eval_path": SAMPLE,
            "data.seq_len": 96,
            "eval.max_new_tokens": 16,
        },
        arg=arg,
    )
