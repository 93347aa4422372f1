#!/usr/bin/env python
"""Makes tests/interop/fixtures/nanochat_release/: a tiny random model built, saved and run by
karpathy/nanochat's OWN code (its GPT as of commit 92d63d4, imported from --release_src, never copied), so
that our importer can be checked against it without the checkout. It is also that release's driver for
tools/release_parity.py (--release nanochat; --size d12, --logits_of). Everything but what follows is the
LRT release's driver's (experiments/make_nanochat_fixture.py, whose functions this one runs): the build
(torch.manual_seed(0); GPT(config); init_weights(); fp32 on the CPU), the redraw of every parameter so
that nothing is zero (there: and smear_gate N(0, 0.5), smear_lambda 0.5 + N(0, 0.1), backout_lambda
0.2 + N(0, 0.1)), the save with its checkpoint_manager.save_checkpoint into <out>/model/, release.npz
(tokens, logits, loss, grad:<key> of every parameter, decode: its engine.KVCache as its Engine calls
model.forward, a prefill then one token per call), the reload check and --logits_of.

The tiny model: GPTConfig(sequence_len=512, vocab_size=100, n_layer=3, n_head=2, n_kv_head=1, n_embd=32,
window_pattern="SSSL"), the vocabulary tables padded to 128 rows; tokens np.random.default_rng(0)
.integers(0, 100, (1, 136)), the decode's prefill 4 tokens. 136 tokens, because its "S" window is 128 keys
back (a quarter of 512 rounded up to 128): only a query past slot 128 sees the window.
--size d12 is GPTConfig() with every field its default (n_layer 12, n_embd 768, n_head 6, n_kv_head 6,
vocab 32768, context 2048, "SSSL": windows 768 / 2048; value embeddings on layers 1, 3, ..., 11; about
286M parameters), tokens (1, 64), prefill 8, the redrawn Linear weights' and lm_head's 0.2 scaled by
sqrt(64 / 768) (release.npz uncompressed, about 1.1 GB).

What nanochat's GPT does at 92d63d4 that an importer must match (beyond the LRT fork's conventions:
RoPE pairs (i, i + E/2) rotated by -theta, QK RMSNorm after RoPE, weightless norms at torch's eps, relu²
MLP, resid / x0 scalars, value embeddings on alternating layers with the last, softcap 15 on logits
sliced to the real vocabulary):
- smear: after the embedding's norm, x_t += smear_lambda * sigmoid(smear_gate x_t[:24]) * x_(t-1) for
  t >= 1 (x the normed embeddings); in cached decoding, x_(t-1) is the KVCache's prev_embedding;
- x0 (what x0_lambdas mix back in) is the smeared embedding;
- backout: the stream after block n_layer // 2 (here block 1), times backout_lambda, is subtracted from
  the last block's output before the final norm;
- value-embedding gates 3 sigmoid(ve_gate x[:12]) (the LRT fork: 2 sigmoid of 32 channels);
- queries and keys are multiplied by 1.2 after their norm (SDPA's scale stays 1/sqrt(head_dim));
- rotary base 100,000; its cos / sin tables in COMPUTE_DTYPE, float32 on a CPU (the fork: always bf16);
- "S" = (-(-sequence_len // 4 // 128) * 128, 0) left keys, the last layer "L" (the fork: half the context).

  PYTHONPATH=/tmp/relpkgs_nc python -m experiments.make_karpathy_nanochat_fixture --release_src=/tmp/nc_rel

(run from the repo root; the fixture was made so from the checkout at commit 92d63d4, torch 2.13 CPU,
NANOCHAT_DTYPE unset.) To run the release here: its Python needs torch, numpy and filelock, and
rustbpe + tiktoken only because nanochat.checkpoint_manager imports nanochat.tokenizer (no tokenizer is
used): `pip install --target /tmp/relpkgs_nc rustbpe tiktoken` and that folder on PYTHONPATH. Flash
Attention 3 is not loaded without CUDA: nanochat/flash_attention.py's own SDPA fallback made these
outputs. No other shim. The script re-runs itself under --release_python and imports nothing of ours there.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from experiments import make_nanochat_fixture as driver
from experiments.release_python import run_under

RELEASE_MARK = "smear_gate"  # a parameter of karpathy/nanochat's GPT since early 2026, not of the LRT fork
TINY = dict(
    sequence_len=512, vocab_size=100, n_layer=3, n_head=2, n_kv_head=1, n_embd=32, window_pattern="SSSL"
)
D12_SCALE = (64 / 768) ** 0.5  # the LRT driver's d12 scale: outputs at the tiny LRT model's scale
SIZES = {
    "tiny": driver.Size(TINY, (1, 136), 4, 1.0, True),
    "d12": driver.Size({}, (1, 64), 8, D12_SCALE, False),
}


def check_release(src: str, python: str) -> None:
    """A checkout of karpathy/nanochat with smear (92d63d4 or near it) and a Python, else one ValueError."""
    driver.check_checkout(src, python, "karpathy/nanochat", RELEASE_MARK, driver.RELEASE_MARK)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = driver.parse_args(
        argv,
        prog=__spec__.name,
        description=__doc__,
        repo="karpathy/nanochat",
        check=check_release,
        sizes=SIZES,
        default_out=driver.ROOT / "tests/interop/fixtures/nanochat_release",
    )
    run_under(args.release_python, __spec__.name, argv)
    logging.disable(logging.INFO)  # the release logs every save at INFO
    if args.logits_of:
        driver.export_logits(Path(args.out), args.release_src, Path(args.logits_of), Path(args.tokens_from))
    else:
        driver.make(Path(args.out), args.release_src, SIZES[args.size])


if __name__ == "__main__":
    main()
