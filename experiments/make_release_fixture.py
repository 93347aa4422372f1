#!/usr/bin/env python
"""Makes tests/interop/fixtures/release_default/: a tiny random T²MLR model built and saved by the authors'
PyTorch release (princeton-pli/T2MLR, imported from --release_src, never copied) with its DEFAULT
T2MLRSettings, and the release's own outputs on fixed tokens, for tests/interop/test_release_defaults.py.

Only what the defaults leave out is chosen: a tiny Llama backbone (vocab 64, hidden 32, 4 layers, 4 heads /
2 kv heads), the recurrent window (l_start 1, l_end 2: a block below and one above it) and a mixer whose
recurrence is on (the release's `gated` with use_learnable_gate, as all its training scripts run it; the
default mixer is `none`). Everything else, the Jacobi depths D = 1 and B = 10,000,000 among them, is the
release's default. Then every parameter is drawn at random (seeded), so that the gates are open (the
rezero gammas start at 0), and the model is saved with the release's save_pretrained into
<out>/model/. <out>/release.npz holds, for 2 rows of 12 tokens, all recurrent (control flow 2):
  tokens                     the token ids
  exact                      logits of the release's eval() forward (exact sequential recurrence)
  jacobi_d1, jacobi_d3       logits of its train() forward (Jacobi) at the saved D = 1, and at D = 3
  grad_d1:<key>, grad_d3:<key>  the gradient of the mean next-token cross-entropy of that Jacobi forward
                             for every parameter, by its key in the saved state dict (B stays the default)

  python -m experiments.make_release_fixture --release_src=../T2MLR \
      --release_python=../release_venv/bin/python

The release needs torch and transformers 4.56/4.57 (--release_python; how to get both: run
experiments/vs_release.py without --release_src); this script re-runs itself under --release_python and
imports nothing of ours there.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from experiments.benchmarks.vs_release_torch import (  # stdlib only: runs under the release's Python
    check_release,
    check_transformers,
    import_release,
)
from experiments.release_python import run_under

ROOT = Path(__file__).resolve().parents[1]

BACKBONE = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
)
SETTINGS = dict(l_start=1, l_end=2, recurrent_mixing_module_name="gated", use_learnable_gate=True)
TOKENS = (2, 12)  # rows x tokens
DEPTHS = (1, 3)  # Jacobi D: the release's default and one with refinement passes (B stays its default)
SEED = 0


def release_classes(src: str):
    """(T2MLRConfig, T2MLRWrapper) of the release checkout at `src`, imported with vs_release's shims."""
    import_release(src)
    from t2mlr_wrapper import T2MLRConfig, T2MLRWrapper

    return T2MLRConfig, T2MLRWrapper


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--release_src", required=True, help="a checkout of princeton-pli/T2MLR")
    parser.add_argument(
        "--release_python",
        default=sys.executable,
        help="a Python with torch and transformers 4.57 to run the release (default: this one)",
    )
    parser.add_argument(
        "--out",
        default=str(ROOT / "tests/interop/fixtures/release_default"),
        help="the fixture folder (default tests/interop/fixtures/release_default)",
    )
    args = parser.parse_args(argv)
    try:
        check_release(args.release_src, args.release_python)
    except ValueError as e:
        parser.error(str(e))
    return args


def build(release):
    """The release's wrapper over a tiny Llama, its settings the defaults but SETTINGS, every parameter
    drawn at random: weights N(0, 0.2), norm weights 1 + N(0, 0.1), the mixer's gammas N(0.5, 0.2)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    T2MLRConfig, T2MLRWrapper = release
    torch.manual_seed(SEED)
    base = LlamaForCausalLM(LlamaConfig(**BACKBONE, dtype=torch.float32, attn_implementation="eager"))
    model = T2MLRWrapper(
        T2MLRConfig(base_config=base.config.to_dict(), base_model_type="llama", **SETTINGS), base
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif "rezero_gamma" in name:
                p.copy_(0.5 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.2 * torch.randn_like(p))
    return model


def release_outputs(model, tokens) -> dict:
    """The arrays of release.npz (see above) for `tokens`, all recurrent."""
    import torch
    import torch.nn.functional as F

    def logits():
        return model(
            input_ids=tokens, control_flows=torch.full_like(tokens, 2), attention_mask=torch.ones_like(tokens)
        ).logits

    arrays = {"tokens": tokens.numpy()}
    model.train()  # the release's train(): the Jacobi ("batch approximate") forward at the config's depth
    for depth in DEPTHS:
        model.config.batch_forward_approximate_depth = depth
        model.zero_grad(set_to_none=True)
        out = logits()
        F.cross_entropy(out[:, :-1].flatten(0, 1), tokens[:, 1:].flatten()).backward()
        arrays[f"jacobi_d{depth}"] = out.detach().numpy()
        arrays |= {f"grad_d{depth}:{name}": p.grad.numpy() for name, p in model.named_parameters()}
    model.eval()  # its eval(): exact sequential recurrence
    with torch.no_grad():
        arrays["exact"] = logits().numpy()
    return arrays


def make(out: Path, release) -> None:
    import numpy as np
    import torch

    model = build(release)
    model.save_pretrained(out / "model")  # before any forward: train() / eval() set config.batch_forward
    tokens = torch.from_numpy(np.random.default_rng(SEED).integers(0, BACKBONE["vocab_size"], TOKENS))
    np.savez_compressed(out / "release.npz", **release_outputs(model, tokens))
    saved = json.loads((out / "model/config.json").read_text())
    depths = saved["batch_forward_approximate_depth"], saved["batch_backward_approximate_depth"]
    print(f"wrote {out}/model and {out}/release.npz (saved D = {depths[0]}, B = {depths[1]})")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    run_under(args.release_python, __spec__.name, argv)
    check_transformers()
    logging.disable(logging.WARNING)  # the release logs every model build at INFO
    make(Path(args.out), release_classes(args.release_src))


if __name__ == "__main__":
    main()
