"""The Latent Recurrent Transformer on nanochat's MoE backbone, trained with Muon and measured in bits per
byte (the depth-versus-time paper: its Appendix C recipe).

Default: the paper's 16-layer reference (1024 wide, 8 routed experts + 1 shared, 0.80B parameters) on
FineWeb-Edu-like text: 2048-token rows, 2^19 tokens per step, MuonAdamW (matrices 0.02, embeddings 0.3,
head 0.004, scalars 0.5; betas 0.8, 0.95; no warmup, linear decay to 0 over the last half), P in
{1,2,3,4} w.p. (0.4, 0.3, 0.2, 0.1), exact sequential BPB evaluation. Give data.train_path /
data.eval_path (token stores from tools/prepare_text.py, or raw text) and nanochat's 32,768-token
tokenizer (tools/train_tokenizer.py --vocab_size=32768).

Presets (comma list, `cpu` last):
  d20      the 20-layer reference (1280 wide, 1.42B)
  vanilla  the plain backbone (lrt.feedback=none): the vanilla NanoChat baseline
  cpu      a 4-layer, 128-wide LRT (MoE, Muon) on offline Shakespeare with the SmolLM2 tokenizer; trains in
           minutes on a CPU and writes BPB per step and a final exact-recurrence BPB
Ablations: --config.lrt.feedback=residual|kv|both|none, --config.lrt.shared_projections=True.
Example: python main.py --config=configs/lrt_nanochat.py:cpu --workdir=runs/lrt_cpu
"""

from configs.recipes import OFFLINE_HINT, backbone_preset, shakespeare_split, smollm2_tokenizer
from t2mlr_jax.config.edit import apply_preset, set_path
from t2mlr_jax.experiment import experiment
from t2mlr_jax.model.presets import nanochat
from t2mlr_jax.train.optimizer import MUON_RECIPE

SEQ_LEN = 2048
BATCH = 2**19 // SEQ_LEN  # rows per step: nanochat's reference 2^19 tokens
DATA_RATIO = 10  # training tokens per parameter (Table 1's data ratio)


def _steps(params: float) -> int:
    return round(DATA_RATIO * params / (BATCH * SEQ_LEN))


def get_config(arg=None):
    config = experiment(
        name="lrt_nanochat",
        arch="lrt",
        model=nanochat(16, seq_len=SEQ_LEN),
        data=dict(kind="text", seq_len=SEQ_LEN, tokenizer=""),
        train=dict(
            steps=_steps(0.805e9),
            batch_size=BATCH,
            grad_accum=16,
            log_every=50,
            eval_every=1000,
            checkpoint_every=1000,
            keep_checkpoints=3,
        ),
        evaluation=dict(batch_size=16, num_examples=1024),
        baseline=dict(param_match=False),
    )
    for path, value in {**MUON_RECIPE, "optimizer.muon.batch_tokens": BATCH * SEQ_LEN}.items():
        set_path(config, path, value)
    shakespeare = shakespeare_split()
    # the SmolLM2 tokenizer's vocabulary
    cpu_model = nanochat(4, seq_len=64, width=128, head_dim=64, vocab_size=49152, dtype="float32")
    return apply_preset(
        config,
        arg,
        {
            "d20": {
                **backbone_preset(nanochat(20, seq_len=SEQ_LEN)),
                "train.steps": _steps(1.42e9),
            },
            "vanilla": {"lrt.feedback": "none"},
            "cpu": {
                **backbone_preset(cpu_model),
                "data.tokenizer": smollm2_tokenizer(),
                "data.hint": OFFLINE_HINT,
                "data.train_path": shakespeare[0],
                "data.eval_path": shakespeare[1],  # The Tempest and The Winter's Tale, held out
                "data.seq_len": 64,
                "train.steps": 150,
                "train.batch_size": 8,
                "train.grad_accum": 1,
                "train.log_every": 1,  # BPB of every step in metrics.jsonl
                "train.eval_every": 0,
                "train.checkpoint_every": 50,
                "optimizer.muon.batch_tokens": 0,  # LRs unscaled: x sqrt(1k / 2^19) they barely move
                "eval.batch_size": 32,
                "eval.num_examples": 128,  # 8k held-out tokens
            },
        },
    )
