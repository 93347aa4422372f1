"""ProsQA-Hard (paper Section 4.2: ~60 concepts, proofs of ~8 steps) from pretrained SmolLM2-135M: T²MLR with
code l_start 1, D=8, B=4; examples generated on the fly; greedy generation, scored as a valid shortest
proof with the right answer. --config.init_from is required (SmolLM2-135M as an HF folder or .gguf).

Presets (configs.recipes.finetuning):
  release  (the default) scripts/prosqa/train_prosqa.sh: LR 5e-4, AdamW (0.9, 0.99), wd 0.01, 5% warmup,
           cosine to 1%, batch 128 (16 x 8 accumulation), 0.6 epochs (its NUM_TRAIN_EPOCHS) of a training
           set of ProsQA's size (17,886 examples, Hao et al. 2024; the release's ProsQA-Hard file is not
           published): 84 steps
  paper    AdamW (0.9, 0.999) (the paper's finetuning recipe, Appendix F.3)
  baseline, cpu (the shipped SmolLM2-135M-Instruct GGUF, small graphs)."""

from configs.recipes import finetuning


def get_config(arg=None):
    return finetuning(
        "prosqa",
        l_start=1,
        d_forward=8,
        d_backward=4,
        data=dict(kind="generated", task="prosqa", seq_len=1024, train_examples=17_886, eval_split="test"),
        # 0.6 epochs of data.train_examples (train.steps from them)
        train=dict(epochs=0.6, batch_size=128, grad_accum=8, log_every=10, eval_every=0, checkpoint_every=50),
        evaluation=dict(batch_size=32, num_examples=500, max_new_tokens=192),
        cpu={
            "data.seq_len": 256,
            "data.options.min_concepts": 12,
            "data.options.max_concepts": 14,
            "data.options.min_path": 3,
            "data.options.max_path": 4,
            "eval.max_new_tokens": 48,
        },
        arg=arg,
    )
