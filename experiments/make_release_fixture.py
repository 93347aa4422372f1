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

It is also the release-side driver of tools/release_parity.py (--release t2mlr): `--size NAME --out DIR`
writes DIR/model/ (the release's save_pretrained) and DIR/release.npz in the layout of
t2mlr_jax/interop/parity.py, all positions recurrent (control flow 2):
  tokens        np.random.default_rng(0).integers(0, vocab_size, the size's shape)
  logits        the release's eval() forward: its exact sequential recurrence
  train_logits:0  its train() forward: the Jacobi iteration at the saved D
  loss          mean next-token cross-entropy of the train() forward on tokens[:, :-1] against tokens[:, 1:]
  grad:<key>    that loss's gradient (B the saved one) for every parameter, by its key in the state dict
  decode        its cached decode, as its generate() calls forward (the eval's path: eval(), the wrapper's
                _force_simple_recurrent, a recurrent prompt): the first `prefill` tokens in one call (its
                exact recurrence, which returns the KV cache), then one token per call with that
                DynamicCache and its carried recurrent state (teacher forcing); before it returns, the
                driver checks that this loop gives the logits generate() itself gives its greedy tokens
Sizes: tiny, the fixture's model and settings (tokens 2 x 12, prefill 4), and smollm135m, the paper's
smallest: SmolLM2-135M's shapes (30 layers, width 576, 9 / 3 heads, vocab 49152, tied embeddings, rope
theta 1e5) at the window (13,18) (code l_start 12, l_end 17), the gated mixer with W_rec, temporal residual
on, Jacobi D = 16, B = 4, as configs/smollm135m_t2mlr.py:w13_18 and experiments/vs_release.py build it
(tokens 1 x 64, prefill 16; about 136M parameters; its weights N(0, 0.2 x sqrt(32 / 576)) so that the
30 layers keep the tiny model's scale). The saved model is loaded back with the release's
T2MLRWrapper.from_pretrained_with_t2mlr (as its eval loads one) and its logits must equal `logits`.
`--logits_of DIR --tokens_from NPZ --out OUT` loads DIR so (e.g. an export of ours) and writes
OUT/export_logits.npz: `logits`, its eval() forward on NPZ's `tokens`.

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
from typing import NamedTuple

from experiments.benchmarks.vs_release_torch import (  # stdlib only: runs under the release's Python
    check_release,  # also what tools/release_parity.py checks a checkout with
    check_transformers,
    import_release,
)
from experiments.release_python import parse_driver_args, release_commit, run_under, write_export_logits

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
PREFILL = 4  # --size tiny's decode: tokens 0..3 in one call, then one per call

# The paper's smallest (configs/smollm135m_t2mlr.py:w13_18): SmolLM2-135M's shapes, code window (12, 17).
SMOLLM2_135M = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    rms_norm_eps=1e-5,
    rope_theta=100_000.0,
    tie_word_embeddings=True,
    max_position_embeddings=8192,
)
W13_18 = dict(
    SETTINGS,
    l_start=12,
    l_end=17,
    use_recurrent_projection=True,
    recurrent_state_proj_type="linear",
    gate_weight_init_std=1.0,
    recurrent_residual_to_recurrent_cache=True,
    recurrent_residual_to_recurrent_cache_weight=1.0,
    recurrent_residual_to_recurrent_cache_post_norm=True,
    recurrent_residual_to_recurrent_cache_post_norm_clamp=5.0,
    batch_forward_approximate_depth=16,
    batch_backward_approximate_depth=4,
)


class Size(NamedTuple):
    """A model the driver makes for tools/release_parity.py: the Llama backbone and T²MLR settings (the rest
    at the release's defaults), the tokens' shape (rows x tokens), the decode's prefill, the scale of the
    redrawn weights' 0.2, and whether release.npz is compressed."""

    backbone: dict
    settings: dict
    tokens: tuple[int, int]
    prefill: int
    weight_scale: float
    compressed: bool


SIZES = {
    "tiny": Size(BACKBONE, SETTINGS, TOKENS, PREFILL, 1.0, True),
    "smollm135m": Size(
        SMOLLM2_135M,
        W13_18,
        (1, 64),
        16,
        (BACKBONE["hidden_size"] / SMOLLM2_135M["hidden_size"]) ** 0.5,
        False,
    ),
}


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
        "--size",
        choices=sorted(SIZES),
        help="instead of the fixture: this model's outputs for tools/release_parity.py (needs --out)",
    )
    return parse_driver_args(
        parser, argv, check_release, ROOT / "tests/interop/fixtures/release_default", None
    )


def build(release, size: Size = SIZES["tiny"]):
    """The release's wrapper over a Llama of the size's shapes, its settings the defaults but the size's,
    every parameter drawn at random: weights N(0, 0.2 x weight_scale), norm weights 1 + N(0, 0.1), the
    mixer's gammas N(0.5, 0.2)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    T2MLRConfig, T2MLRWrapper = release
    torch.manual_seed(SEED)
    base = LlamaForCausalLM(LlamaConfig(**size.backbone, dtype=torch.float32, attn_implementation="eager"))
    model = T2MLRWrapper(
        T2MLRConfig(base_config=base.config.to_dict(), base_model_type="llama", **size.settings), base
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif "rezero_gamma" in name:
                p.copy_(0.5 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.2 * size.weight_scale * torch.randn_like(p))
    return model


def release_outputs(model, tokens) -> dict:
    """The arrays of release.npz (see above) for `tokens`, all recurrent."""
    import torch.nn.functional as F

    arrays = {"tokens": tokens.numpy()}
    model.train()  # the release's train(): the Jacobi ("batch approximate") forward at the config's depth
    for depth in DEPTHS:
        model.config.batch_forward_approximate_depth = depth
        model.zero_grad(set_to_none=True)
        out = recurrent(model, tokens).logits
        F.cross_entropy(out[:, :-1].flatten(0, 1), tokens[:, 1:].flatten()).backward()
        arrays[f"jacobi_d{depth}"] = out.detach().numpy()
        arrays |= {f"grad_d{depth}:{name}": p.grad.numpy() for name, p in model.named_parameters()}
    arrays["exact"] = exact_logits(model, tokens).numpy()  # its eval(): exact sequential recurrence
    return arrays


def recurrent(model, tokens, **kwargs):
    """The wrapper's forward on `tokens`, every position recurrent (control flow 2), nothing masked."""
    import torch

    flows = torch.full_like(tokens, 2)
    return model(input_ids=tokens, control_flows=flows, attention_mask=torch.ones_like(tokens), **kwargs)


def exact_logits(model, tokens):
    """The release's eval() forward: its exact sequential recurrence."""
    import torch

    model.eval()
    with torch.no_grad():
        return recurrent(model, tokens).logits


def decode(model, tokens, prefill: int):
    """Logits of the release's cached decode of `tokens` (teacher forced), called as its generate() calls
    forward: the prompt in one call, then one token per call with the returned KV cache."""
    import torch

    model.eval()
    model.recurrent_cache, model._force_simple_recurrent = None, True  # as generate() sets them
    try:
        with torch.inference_mode():
            out = recurrent(model, tokens[:, :prefill], use_cache=True)
            logits, cache = [out.logits], out.past_key_values
            for t in range(prefill, tokens.size(1)):
                mask = torch.ones_like(tokens[:, : t + 1])
                flows = torch.full_like(tokens[:, t : t + 1], 2)
                out = model(
                    input_ids=tokens[:, t : t + 1],
                    control_flows=flows,
                    attention_mask=mask,
                    past_key_values=cache,
                    use_cache=True,
                )
                logits.append(out.logits)
                cache = out.past_key_values
    finally:
        model._force_simple_recurrent = False
    assert cache.get_seq_length() == tokens.size(1)
    return torch.cat(logits, dim=1)


def check_decode_is_generate(model, tokens, prefill: int) -> float:
    """`decode`'s loop against the release's own generate() (greedy, a recurrent prompt, as its eval runs
    it) on the tokens generate picks: max |Δ| of their logits, which must be within 1e-5 x max |logit|."""
    import torch

    model.eval()
    new = tokens.size(1) - prefill
    with torch.inference_mode():
        out = model.generate(
            input_ids=tokens[:, :prefill],
            attention_mask=torch.ones_like(tokens[:, :prefill]),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            use_cache=True,
            pad_token_id=0,
            recurrence_in_prompt=True,
            output_logits=True,
            return_dict_in_generate=True,
        )
    generated = torch.stack(out.logits, dim=1)
    looped = decode(model, out.sequences, prefill)[:, prefill - 1 : -1]
    gap = float((generated - looped).abs().max())
    assert gap <= 1e-5 * float(generated.abs().max()), f"the decode loop is not generate(): {gap}"
    return gap


def parity_outputs(model, tokens, prefill: int) -> dict:
    """The arrays of release.npz for tools/release_parity.py (see above) for `tokens`."""
    import torch
    import torch.nn.functional as F

    arrays = {"tokens": tokens.numpy(), "logits": exact_logits(model, tokens).numpy()}
    model.train()  # the Jacobi ("batch approximate") forward at the config's D, B
    with torch.no_grad():
        arrays["train_logits:0"] = recurrent(model, tokens).logits.numpy()
    model.zero_grad(set_to_none=True)
    logits = recurrent(model, tokens[:, :-1].contiguous()).logits
    loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    arrays["loss"] = loss.detach().numpy()
    arrays |= {f"grad:{name}": p.grad.numpy() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    arrays["decode"] = decode(model, tokens, prefill).numpy()
    return arrays


def load(release, folder: Path):
    """A saved model loaded as the release's eval loads one (from_pretrained_with_t2mlr), fp32, with eager
    attention (its loader's default is FlashAttention 2, a CUDA package)."""
    import torch

    model = release[1].from_pretrained_with_t2mlr(str(folder), dtype=torch.float32, attn_impl="eager")
    return model.eval()


def make_size(out: Path, release, src: str, size: Size) -> None:
    import numpy as np
    import torch

    model = build(release, size)
    model.save_pretrained(out / "model")  # before any forward: train() / eval() set config.batch_forward
    vocab_size = size.backbone["vocab_size"]
    tokens = torch.from_numpy(np.random.default_rng(SEED).integers(0, vocab_size, size.tokens))
    arrays = parity_outputs(model, tokens, size.prefill)
    (np.savez_compressed if size.compressed else np.savez)(out / "release.npz", **arrays)
    gap = check_decode_is_generate(model, tokens, size.prefill)
    assert torch.equal(exact_logits(load(release, out / "model"), tokens), torch.from_numpy(arrays["logits"]))
    print(
        f"wrote {out}/model and {out}/release.npz (release {release_commit(src)[:7]}, loss "
        f"{arrays['loss']:.6f}, {sum(k.startswith('grad:') for k in arrays)} gradients; max |decode - "
        f"logits| {np.abs(arrays['decode'] - arrays['logits']).max():.2e}; decode loop vs generate() "
        f"{gap:.2e}; reload's logits equal)"
    )


def export_logits(out: Path, release, src: str, folder: Path, tokens_from: Path) -> None:
    """<out>/export_logits.npz: the release's eval() logits of the model folder `folder` (loaded as its
    eval loads one) on the `tokens` of the .npz `tokens_from`."""
    import numpy as np
    import torch

    with np.load(tokens_from) as npz:
        tokens = torch.from_numpy(npz["tokens"])
    logits = exact_logits(load(release, folder), tokens).numpy()
    write_export_logits(out, src, folder, logits)


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
    release = release_classes(args.release_src)
    if args.logits_of:
        export_logits(Path(args.out), release, args.release_src, Path(args.logits_of), Path(args.tokens_from))
    elif args.size:
        make_size(Path(args.out), release, args.release_src, SIZES[args.size])
    else:
        make(Path(args.out), release)


if __name__ == "__main__":
    main()
