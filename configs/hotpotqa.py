"""HotpotQA (easy) chain-of-thought finetuning (paper Section 4.3) from pretrained SmolLM2-135M: T²MLR with
code l_start 8 (l_end -9), D=16, B=8, every token recurrent. Data: data.train_path / data.eval_path, rows
{question, context, steps|cot, answer}; greedy generation, the answer after "###" compared.
--config.init_from is required (SmolLM2-135M as an HF folder or .gguf).

Presets (t2mlr_jax.config_utils.finetuning):
  release  (the default) scripts/hotpotqa/train_hotpotqa.sh: LR 1e-4, AdamW (0.9, 0.95), no weight decay,
           5% warmup, cosine to 2%, 5000 steps, batch 128: 4 per device x 8 accumulation on the paper's
           4 GPUs (the script does not divide its accumulation by the GPU count; on one GPU it trains 32)
  paper    AdamW (0.9, 0.999), wd 0.01 (the paper's finetuning recipe, Appendix F.3; LR, schedule and
           steps as the release, Table 14)
  baseline, cpu (the shipped SmolLM2-135M-Instruct GGUF on configs/samples/hotpotqa.jsonl: 24 synthetic
           rows in that format, smoke only)."""

from pathlib import Path

from t2mlr_jax.config_utils import finetuning

SAMPLE = str(Path(__file__).resolve().parent / "samples" / "hotpotqa.jsonl")


def get_config(arg=None):
    return finetuning(
        "hotpotqa",
        l_start=8,
        d_forward=16,
        d_backward=8,
        data=dict(
            kind="file",
            format="hotpotqa",
            seq_len=8192,
            all_recurrent=True,
            hint="the paper's HotpotQA chain-of-thought traces (19k, generated with GPT-4o-mini) are not "
            "published: pass JSONL rows {question, context, steps|cot, answer} as --config.data.train_path / "
            "--config.data.eval_path; or try --config=configs/hotpotqa.py:cpu",
        ),
        optimizer=dict(lr=1e-4, b2=0.95, weight_decay=0.0, warmup_ratio=0.05, min_lr_ratio=0.02),
        train=dict(
            steps=5000, batch_size=128, grad_accum=32, log_every=20, eval_every=1000, checkpoint_every=1000
        ),
        evaluation=dict(batch_size=16, num_examples=500, max_new_tokens=512),
        paper={"optimizer.weight_decay": 0.01},
        cpu={
            "data.train_path": SAMPLE,
            "data.eval_path": SAMPLE,
            "data.seq_len": 128,
            "eval.max_new_tokens": 16,
        },
        arg=arg,
    )
