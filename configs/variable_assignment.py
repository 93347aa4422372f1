"""Variable assignment, depth 5 (paper Section 4.2) from pretrained SmolLM2-135M: T²MLR with code l_start 1
(l_end -2), D=8, B=4; examples generated on the fly; greedy generation, exact match on the value.
--config.init_from is required (SmolLM2-135M as an HF folder or .gguf).

Presets (configs.recipes.finetuning):
  release  (the default) scripts/variable_assignment/train_variable_assignment.sh: LR 5e-4, AdamW
           (0.9, 0.99), wd 0.01, 5% warmup, cosine to 1%, batch 256 (128 x 2 accumulation), one epoch of
           its generator's 200,000 training examples (781 steps)
  paper    AdamW (0.9, 0.999) (the paper's finetuning recipe, Appendix F.3)
  baseline, cpu (the shipped SmolLM2-135M-Instruct GGUF, short rows)."""

from configs.recipes import finetuning


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
            train_examples=200_000,  # make_variable_assignment_dataset.py --train default
            eval_split="test",
            options=dict(depth=5),
        ),
        # one epoch of data.train_examples (train.steps from them)
        train=dict(batch_size=256, grad_accum=2, log_every=50, eval_every=500, checkpoint_every=500),
        evaluation=dict(batch_size=64, num_examples=1000, max_new_tokens=8),
        cpu={"data.seq_len": 128, "eval.max_new_tokens": 4},
        arg=arg,
    )
