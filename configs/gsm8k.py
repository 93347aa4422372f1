"""GSM8K-Aug finetuning (paper Section 4.3) from pretrained SmolLM2-135M: T²MLR with code l_start 4 (l_end
-5), D=16, B=8, the gate LR boosted x100. Data: data.train_path / data.eval_path, GSM8K-Aug rows
{question, steps, answer} (JSONL/JSON/parquet); greedy generation, the answer after "###" compared.
--config.init_from is required (SmolLM2-135M as an HF folder or .gguf).

Presets (configs.recipes.finetuning):
  release  (the default) scripts/gsm8k/train_gsm8k.sh: LR 5e-4, AdamW (0.9, 0.99), wd 0.01, 3% warmup,
           cosine to 1%, batch 256 (64 x 4 accumulation), one epoch of the training file
  paper    the paper (Section 4.3, Table 14, Appendix F.3): LR 5e-5, AdamW (0.9, 0.999), cosine (to 0),
           8,000 steps
  baseline, cpu (the shipped SmolLM2-135M-Instruct GGUF on configs/samples/gsm8k_aug.jsonl: 24 synthetic
           rows in that format, smoke only)."""

from pathlib import Path

from configs.recipes import finetuning

SAMPLE = str(Path(__file__).resolve().parent / "samples" / "gsm8k_aug.jsonl")


def get_config(arg=None):
    return finetuning(
        "gsm8k",
        l_start=4,
        d_forward=16,
        d_backward=8,
        data=dict(
            kind="file",
            format="gsm8k_aug",
            seq_len=1024,
            hint="GSM8K-Aug is whynlp/gsm8k-aug on the Hugging Face hub: on a machine with network, write "
            "its train and test splits as JSONL rows {question, steps, answer} and pass "
            "--config.data.train_path / --config.data.eval_path; or try --config=configs/gsm8k.py:cpu",
        ),
        optimizer=dict(warmup_ratio=0.03, gate_lr_multiplier=100.0),
        # one epoch of the training file (train.steps from its rows)
        train=dict(batch_size=256, grad_accum=4, log_every=20, eval_every=1000, checkpoint_every=1000),
        evaluation=dict(batch_size=64, num_examples=1319, max_new_tokens=256),
        paper={"optimizer.lr": 5e-5, "optimizer.min_lr_ratio": 0.0, "train.epochs": 0.0, "train.steps": 8000},
        cpu={
            "data.train_path": SAMPLE,
            "data.eval_path": SAMPLE,
            "data.seq_len": 96,
            "eval.max_new_tokens": 16,
        },
        arg=arg,
    )
