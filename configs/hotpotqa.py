"""HotpotQA (easy) chain-of-thought finetuning (paper Section 4.3) from pretrained SmolLM2-135M. Data:
data.train_path / data.eval_path, rows {question, context, steps|cot, answer}; the answer after "###"
compared. --config.init_from is required (SmolLM2-135M as an HF folder or .gguf).

Presets (configs.recipes.finetuning):
  release  (the default) what the release runs: scripts/hotpotqa/train_hotpotqa.sh as bash evaluates it,
           with its sweep_params.yaml's T²MLR run (L_START 1, RECURRENT_RESIDUAL_TO_RECURRENT_CACHE True) on
           the 2 GPUs it requests (#SBATCH --gres=gpu:2). Window l_start 1 (l_end -2), D=16, B=8, every
           token recurrent. The script compares USE_GATE=True with "on", so it passes
           --use_learnable_gate False: the release's gated module then has no gate projections and its
           forward's default gates 1 and 0 (--recurrent_weight / --orig_weight 0.5 reach no forward), our
           `gated_fixed`: x + tanh(γ_rec) W_rec R. Temporal residual on, detached, rescaled (the script's
           defaults). AdamW (0.9, 0.95), LR 1e-4, no weight decay, 5% warmup, cosine to 2%, 5000 steps,
           batch 64 (4 per device x 8 accumulation x 2 GPUs; micro-batches of 4). Evaluation (only at the
           end) samples one answer per question (--do_sample True, HF's defaults: temperature 1, top-k 50,
           top-p 1) with up to 1024 new tokens (the release: max(reference + 1024, 1024) per batch).
           tests/test_release_recipes.py checks this preset against the release's own argument parser.
           As committed the script stops at `set -u` on the unset MAX_NEW_TOKENS and defaults DO_TRAIN to
           False (evaluation only); this preset is the run with MAX_NEW_TOKENS empty, trained.
  paper    the learnable-gate variant: `gated` (both gates learned, gain 1e-2, biases at 0.5), the
           script's default window l_start 8 (l_end -9; Figure 6's D = 14), no temporal residual, AdamW
           (0.9, 0.999), wd 0.01 (the paper's finetuning recipe, Appendix F.3), batch 128 (4 x 8 on the
           paper's 4 GPUs); LR, schedule and steps as the release (Table 14)
  baseline, cpu (the shipped SmolLM2-135M-Instruct GGUF on configs/samples/hotpotqa.jsonl: 24 synthetic
           rows in that format, smoke only)."""

from pathlib import Path

from configs.recipes import finetuning

SAMPLE = str(Path(__file__).resolve().parent / "samples" / "hotpotqa.jsonl")


def get_config(arg=None):
    return finetuning(
        "hotpotqa",
        l_start=1,
        d_forward=16,
        d_backward=8,
        recurrence=dict(mixer="gated_fixed", temporal_residual=True, temporal_residual_detach=True),
        data=dict(
            kind="file",
            format="hotpotqa",
            seq_len=8192,
            all_recurrent=True,
            hint="the paper's HotpotQA chain-of-thought traces (19k, generated with GPT-4o-mini) are not "
            "published: pass JSONL rows {question, context, steps|cot, answer} as --config.data.train_path / "
            "--config.data.eval_path; or try --config=configs/hotpotqa.py:cpu",
        ),
        optimizer=dict(lr=1e-4, warmup_ratio=0.05, min_lr_ratio=0.02, adamw=dict(b2=0.95, weight_decay=0.0)),
        train=dict(
            epochs=0.0,  # train.steps as given, not one epoch (configs.recipes.FINETUNING_TRAIN)
            steps=5000,
            batch_size=64,
            grad_accum=16,
            log_every=20,
            eval_every=0,
            checkpoint_every=1000,
        ),
        evaluation=dict(batch_size=64, num_examples=500, max_new_tokens=1024, temperature=1.0, top_k=50),
        paper={
            "model.recurrence.mixer": "gated",
            "model.recurrence.l_start": 8,
            "model.recurrence.l_end": -9,
            "model.recurrence.temporal_residual": False,
            "model.recurrence.temporal_residual_detach": False,
            "optimizer.adamw.weight_decay": 0.01,
            "train.batch_size": 128,
            "train.grad_accum": 32,
        },
        cpu={
            "data.train_path": SAMPLE,
            "data.eval_path": SAMPLE,
            "data.seq_len": 128,
            "eval.max_new_tokens": 16,
        },
        arg=arg,
    )
