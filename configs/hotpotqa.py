"""HotpotQA (easy) chain-of-thought finetuning (paper Section 4.3): SmolLM2-135M T²MLR with code
l_start 8 (l_end -9), D=16, B=8, every token recurrent, the release's script: LR 1e-4, AdamW (0.9, 0.95),
no weight decay, 5% warmup, cosine to 2%, batch 64, 5000 steps. Data: data.train_path / data.eval_path,
rows {question, context, steps|cot, answer}; greedy generation, the answer after "###" compared.
Presets: baseline, cpu (configs/samples/hotpotqa.jsonl: 24 synthetic rows in that format, smoke only)."""

from pathlib import Path

from t2mlr_jax.config_utils import finetuning

SAMPLE = str(Path(__file__).resolve().parent / "samples" / "hotpotqa.jsonl")


def get_config(arg=None):
    return finetuning(
        "hotpotqa",
        l_start=8,
        d_forward=16,
        d_backward=8,
        data=dict(kind="file", format="hotpotqa", seq_len=8192, all_recurrent=True),
        optimizer=dict(lr=1e-4, b2=0.95, weight_decay=0.0, warmup_ratio=0.05, min_lr_ratio=0.02),
        train=dict(
            steps=5000, batch_size=64, grad_accum=16, log_every=20, eval_every=1000, checkpoint_every=1000
        ),
        evaluation=dict(batch_size=16, num_examples=500, max_new_tokens=512),
        cpu={
            "data.train_path": SAMPLE,
            "data.eval_path": SAMPLE,
            "data.seq_len": 128,
            "eval.max_new_tokens": 16,
        },
        arg=arg,
    )
