#!/usr/bin/env python
"""Makes tests/interop/fixtures/lrt_release_vanilla/: a tiny random model built, saved and run by the Latent
Recurrent Transformer release's OWN code (OoDBag/Latent_recurrent_transformer, a nanochat fork, imported
from --release_src, never copied), so that our importer can be checked against it without the checkout.
It is also the release-side driver of tools/release_parity.py (--size d12, --logits_of; see the end).
--size tiny_interleaved / d12_interleaved build the release's recurrent GPT (use_interleaved=True; the
same draws, its own parameters too): release.npz then holds `tokens` and `logits`, its true sequential
inference (loss_eval.evaluate_bpb_sequential's loop: a token per call, fed the previous h_final), and its
training step, forward_interleaved_train (a full pass, then interleaved_num_passes = 2 passes over the
positions t % 2 == 0, then 1), on tokens[:, :-1] against tokens[:, 1:]:
  train_logits:<p>  pass p's logits (p = 0 the full pass [B, T-1, V], p = 1, 2 the interleaved ones at
                    their positions), lm_head's outputs as a forward hook records them, sliced to the
                    vocabulary and softcapped (15) as the release's forward does
  pass_losses, loss its per-pass losses and their mean, the loss it trains on (float32)
  grad:<key>        that loss's gradient for every parameter
  refresh_logits:<p>, refresh_pass_losses, refresh_loss  the same step with interleaved_kv_refresh=True
                    (its cheap re-projection of the not-yet-rerun positions' keys / values between
                    passes; no gradients, to keep the fixture small)
tests/interop/fixtures/lrt_release_interleaved/ is tiny_interleaved (830 KB, most of it the gradients).

The model is the release's vanilla (non-recurrent baseline) GPT, use_interleaved=False:
  GPTConfig(sequence_len=16, vocab_size=100, n_layer=4, n_head=4, n_kv_head=2, n_embd=64,
            window_pattern="SL", use_value_embeds=True, ve_every_layer=False, use_x0_residual=True,
            use_resid_lambdas=True, ve_gate_channels=32, use_interleaved=False)
built as the release builds it (torch.manual_seed(0); GPT(config); model.init_weights(); fp32 on CPU; the
release pads wte / lm_head / value_embeds to 128 rows). Then every parameter, padded rows included, is
redrawn at random (same seeded stream) so that nothing is zero or identity: wte N(0, 1); c_q, c_k, c_v,
attn and mlp c_proj, c_fc, value_embeds, lm_head N(0, 0.2); ve_gate N(0, 0.5); resid_lambdas
1 + N(0, 0.1); x0_lambdas 0.2 + N(0, 0.1). It is saved with the release's
nanochat.checkpoint_manager.save_checkpoint into <out>/model/ (model_000000.pt, the state dict;
meta_000000.json, {"model_config": asdict(config), "step": 0, "release_commit": the checkout's HEAD}).
<out>/release.npz holds, for tokens = np.random.default_rng(0).integers(0, 100, (2, 12)):
  tokens        int64 [2, 12]
  logits        model(tokens), the release's forward (softcap 15, padding sliced off): [2, 12, 100] float32
  loss          the release's loss model(tokens[:, :-1], targets=tokens[:, 1:])[0] (mean cross-entropy
                of a forward on the first 11 tokens; both slices made contiguous, as the release's
                dataloader gives them, since its loss calls targets.view(-1)), a float32 scalar
  grad:<key>    that loss's gradient for every parameter, by its key in the saved state dict (float32)
  decode        cached decoding with the release's nanochat.engine.KVCache (batch 2, n_kv_head heads,
                seq_len 16, head_dim 16, 4 layers, fp32), called as its Engine calls model.forward:
                one prefill call on tokens 0..3, then tokens 4..11 one per call (teacher forcing); the
                logits of every call, [2, 4 + 8, 100] float32
What the release's forward does that an importer must match: rotary cos/sin are rounded to bfloat16 (the
forward asserts it) and multiply fp32 q / k; QK RMSNorm after rotary; a window "S" is (sequence_len // 2,
0) = 8 LEFT keys plus the query's own (9 in all), "L" is 16, and the last layer is always "L" (here
[(8, 0), (16, 0), (8, 0), (16, 0)]); value embeddings and their gates sit on layers 1 and 3 (the last
layer and every other one below it), the gate 2 * sigmoid of the first 32 channels; logits are sliced
to the 100 real rows before the softcap. The grads of the padded rows (100..127) of wte / value_embeds /
lm_head are zero, as are those of the table rows of tokens absent from `tokens`.
Before it returns, the saved checkpoint is loaded back the way the release's checkpoint_manager.build_model
loads one (load_checkpoint; GPT on the meta device, to_empty, init_weights for the rotary tables,
load_state_dict strict, assign) and its logits must equal `logits` exactly.

  PYTHONPATH=/tmp/relpkgs python -m experiments.make_nanochat_fixture --release_src=/tmp/lrt_rel

(run from the repo root; the fixture was made so from the checkout at commit e0d0f6e, torch 2.13 CPU.)

--size d12 makes the same outputs for the release's default model, GPTConfig() with every field its default
(n_layer 12, n_embd 768, n_head 6, n_kv_head 6, vocab_size 32768, sequence_len 2048, window_pattern "SSSL":
windows 1024 / 2048, value embeddings on layers 1, 3, ..., 11), about 286M parameters: tokens
np.random.default_rng(0).integers(0, 32768, (1, 64)), a prefill of 8 tokens then 56 one at a time, the
KVCache sized to sequence_len as the tiny one's is. Its redraw is the tiny one's with the 0.2 of every
Linear weight (c_q, c_k, c_v, c_proj, c_fc) and of lm_head scaled by sqrt(64 / n_embd), so that their
outputs keep the tiny model's scale instead of saturating the softcap. Its release.npz is written with
np.savez (uncompressed: the gradients alone are about 1.1 GB). --out is required with --size d12.

--logits_of DIR --tokens_from NPZ loads the checkpoint folder DIR (model_000000.pt + meta_000000.json, e.g. an
export of ours) the way the release's build_model loads one (as the reload check below) and writes
<out>/export_logits.npz: `logits`, the release's forward on NPZ's `tokens`.

What it takes to run the release here, and nothing more: the release's Python needs torch, numpy,
filelock and tokenizers, and rustbpe + tiktoken, which are installed only because
nanochat.checkpoint_manager imports nanochat.tokenizer at module level (no tokenizer is used):
`pip install --target /tmp/relpkgs rustbpe tiktoken`, then put that folder on PYTHONPATH (or pass a
--release_python that has them). --release_src is put at the front of sys.path by this script. Flash
Attention 3 is not installed: the release's own nanochat/flash_attention.py falls back to PyTorch SDPA
when CUDA is absent, and that SDPA path (with its sliding-window masks) is what made these outputs. The
script re-runs itself under --release_python and imports nothing of ours there.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from pathlib import Path
from typing import NamedTuple

from experiments.release_python import parse_driver_args, release_commit, run_under, write_export_logits

ROOT = Path(__file__).resolve().parents[1]

CONFIG = dict(
    sequence_len=16,
    vocab_size=100,
    n_layer=4,
    n_head=4,
    n_kv_head=2,
    n_embd=64,
    window_pattern="SL",
    use_value_embeds=True,
    ve_every_layer=False,
    use_x0_residual=True,
    use_resid_lambdas=True,
    ve_gate_channels=32,
    use_interleaved=False,
)
TOKENS = (2, 12)  # rows x tokens
PREFILL = 4  # decode: tokens 0..3 in one cached call, then one token per call
SEED = 0
RELEASE_FILES = ("nanochat/gpt.py", "nanochat/checkpoint_manager.py", "nanochat/engine.py")
RELEASE_MARK = "use_interleaved"  # a GPTConfig field of the LRT release's gpt.py, not of karpathy/nanochat's


class Size(NamedTuple):
    """A model the driver makes: GPTConfig fields (the rest at the release's defaults), the tokens' shape
    (rows x tokens), the decode's prefill, the scale of the redrawn Linear weights, and whether release.npz
    is compressed."""

    config: dict
    tokens: tuple[int, int]
    prefill: int
    linear_scale: float
    compressed: bool
    interleaved: bool = False  # the recurrent GPT: release.npz holds its true sequential logits only


RELEASE_DEFAULT_WIDTH = 768  # GPTConfig().n_embd
SIZES = {
    "tiny": Size(CONFIG, TOKENS, PREFILL, 1.0, True),
    "d12": Size({}, (1, 64), 8, (CONFIG["n_embd"] / RELEASE_DEFAULT_WIDTH) ** 0.5, False),
    "tiny_interleaved": Size({**CONFIG, "use_interleaved": True}, TOKENS, PREFILL, 1.0, True, True),
    "d12_interleaved": Size(
        {"use_interleaved": True}, (1, 64), 8, (CONFIG["n_embd"] / RELEASE_DEFAULT_WIDTH) ** 0.5, False, True
    ),
}


def check_release(src: str, python: str) -> None:
    """A checkout of the release and an executable Python to run it, else one ValueError line."""
    check_checkout(src, python, "OoDBag/Latent_recurrent_transformer", RELEASE_MARK, "smear_gate")


def check_checkout(src: str, python: str, repo: str, mark: str, foreign: str) -> None:
    """`src` a checkout of `repo` (its gpt.py names `mark`, not the other nanochat's `foreign`) and
    `python` an executable, else one ValueError line."""
    if not Path(src).is_dir():
        raise ValueError(f"--release_src {src}: no such directory")
    missing = [name for name in RELEASE_FILES if not (Path(src) / name).is_file()]
    if missing:
        raise ValueError(f"--release_src {src} is not a checkout of {repo} (no {', '.join(missing)})")
    gpt = (Path(src) / RELEASE_FILES[0]).read_text(encoding="utf-8", errors="replace")
    if mark not in gpt or foreign in gpt:
        found = f"has no {mark}" if mark not in gpt else f"has {foreign}"
        raise ValueError(
            f"--release_src {src} is not a checkout of {repo} ({RELEASE_FILES[0]} {found}: another nanochat?)"
        )
    if not os.access(python, os.X_OK) or Path(python).is_dir():
        raise ValueError(f"--release_python {python} is not an executable")


def import_release(src: str):
    """The release's modules (gpt, checkpoint_manager, engine), imported from the checkout at `src`."""
    sys.path.insert(0, str(Path(src).resolve()))
    try:
        from nanochat import checkpoint_manager, engine, gpt
    except ModuleNotFoundError as e:
        if e.name in ("rustbpe", "tiktoken"):
            raise SystemExit(
                f"the release's nanochat.tokenizer imports {e.name}: `pip install --target /tmp/relpkgs "
                "rustbpe tiktoken` and run with PYTHONPATH=/tmp/relpkgs"
            ) from e
        raise
    return gpt, checkpoint_manager, engine


def parse_args(
    argv: list[str],
    *,
    prog: str = __spec__.name,
    description: str = __doc__,
    repo: str = "OoDBag/Latent_recurrent_transformer",
    check=check_release,
    sizes: dict = SIZES,
    default_out: Path = ROOT / "tests/interop/fixtures/lrt_release_vanilla",
) -> argparse.Namespace:
    """The CLI of a nanochat driver: this one's, or (the keywords) karpathy/nanochat's."""
    parser = argparse.ArgumentParser(
        prog=f"python -m {prog}",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--release_src", required=True, help=f"a checkout of {repo}")
    parser.add_argument(
        "--release_python",
        default=sys.executable,
        help="a Python with torch, filelock, tokenizers, rustbpe and tiktoken to run the release "
        "(default: this one; PYTHONPATH is passed on)",
    )
    parser.add_argument("--size", default="tiny", choices=sorted(sizes), help="the model (default tiny)")
    return parse_driver_args(parser, argv, check, default_out, "tiny")


def redraw(model, linear_scale: float = 1.0) -> None:
    """Every parameter drawn anew from the global (seeded) stream, padded rows included (see above); the
    Linear weights' and lm_head's 0.2 times `linear_scale`. A draw of exactly 0 (torch's float32 normal
    gives one about once in 2^24 values: none in the tiny model, a few in d12's tables) is set to 1e-3, so
    that nothing is zero."""
    import torch

    linear_std = 0.2 * linear_scale
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "transformer.wte.weight":
                p.copy_(torch.randn_like(p))
            elif name == "resid_lambdas":
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif name == "x0_lambdas":
                p.copy_(0.2 + 0.1 * torch.randn_like(p))
            elif name.endswith(("attn.ve_gate.weight", "attn.triple_gate.weight")):
                p.copy_(0.5 * torch.randn_like(p))
            elif name in ("interleaved_lambdas", "backout_lambda"):  # backout: karpathy/nanochat's
                p.copy_(0.2 + 0.1 * torch.randn_like(p))
            elif name == "smear_gate.weight":
                p.copy_(0.5 * torch.randn_like(p))
            elif name == "smear_lambda":
                p.copy_(0.5 + 0.1 * torch.randn_like(p))
            elif name.startswith(("interleaved_projections.", "interleaved_key_projections.")):
                p.copy_(linear_std * torch.randn_like(p))
            elif name == "lm_head.weight" or name.startswith("transformer.h."):
                p.copy_(linear_std * torch.randn_like(p))
            elif name.startswith(("value_embeds.", "interleaved_init_value_embeds.")):
                p.copy_(0.2 * torch.randn_like(p))
            else:
                raise AssertionError(f"no draw for parameter {name}")
            p.masked_fill_(p == 0, 1e-3)


def build(gpt, size: Size = SIZES["tiny"]):
    """The release's GPT at `size` (vanilla, or interleaved), built as it builds one, then redrawn."""
    import torch

    torch.manual_seed(SEED)
    config = gpt.GPTConfig(**size.config)
    model = gpt.GPT(config)
    model.init_weights()
    redraw(model, size.linear_scale)
    return model, config


def logits_of(model, tokens):
    import torch

    with torch.no_grad():
        return model(tokens)


def decode(model, config, engine, tokens, prefill: int = PREFILL):
    """Logits of the release's cached decoding: a prefill of `prefill` tokens, then one token per call."""
    import torch

    cache = engine.KVCache(
        batch_size=tokens.size(0),
        num_heads=config.n_kv_head,
        seq_len=config.sequence_len,
        head_dim=config.n_embd // config.n_head,
        num_layers=config.n_layer,
        device=tokens.device,
        dtype=torch.float32,
    )
    with torch.inference_mode():  # as Engine.generate
        out = [model.forward(tokens[:, :prefill], kv_cache=cache)]
        for t in range(prefill, tokens.size(1)):
            out.append(model.forward(tokens[:, t : t + 1], kv_cache=cache))
    assert cache.get_pos() == tokens.size(1)
    return torch.cat(out, dim=1)


def sequential(model, config, engine, tokens):
    """The interleaved model's true sequential logits, as the release's loss_eval.evaluate_bpb_sequential
    runs it: one token per call with the KV cache, fed the previous token's h_final (zeros at the first)."""
    import torch

    cache = engine.KVCache(
        batch_size=tokens.size(0),
        num_heads=config.n_kv_head,
        seq_len=tokens.size(1),
        head_dim=config.n_embd // config.n_head,
        num_layers=config.n_layer,
        device=tokens.device,
        dtype=torch.float32,
    )
    h_prev, out = torch.zeros(tokens.size(0), 1, config.n_embd), []
    with torch.no_grad():
        for t in range(tokens.size(1)):
            logits, h_prev = model(
                tokens[:, t : t + 1], kv_cache=cache, h_final_prev=h_prev, return_hidden=True
            )
            out.append(logits)
    return torch.cat(out, dim=1)


def training_step(model, tokens, kv_refresh: bool) -> tuple[dict, object]:
    """The recurrent GPT's training step as the release takes it (forward_interleaved_train: a full pass,
    then config.interleaved_num_passes interleaved passes; config.interleaved_kv_refresh = `kv_refresh`)
    on tokens[:, :-1] against tokens[:, 1:]: ({"logits:<pass>": each pass's logits, "pass_losses": its
    per-pass losses, "loss": the loss}, the loss tensor). The logits are lm_head's outputs, recorded by a
    hook as the release computes them, then sliced to the vocabulary and softcapped as its forward does."""
    import torch

    heads, refresh = [], model.config.interleaved_kv_refresh
    hook = model.lm_head.register_forward_hook(lambda module, args, out: heads.append(out.detach()))
    model.config.interleaved_kv_refresh = kv_refresh
    try:
        out = model.forward_interleaved_train(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
    finally:
        hook.remove()
        model.config.interleaved_kv_refresh = refresh
    softcap, vocab = 15, model.config.vocab_size  # gpt.py's forward / forward_interleaved
    arrays = {
        f"logits:{i}": (softcap * torch.tanh(head[..., :vocab].float() / softcap)).numpy()
        for i, head in enumerate(heads)
    }
    arrays["pass_losses"] = torch.stack(out["per_pass_losses"]).detach().numpy()
    arrays["loss"] = out["loss"].detach().numpy()
    return arrays, out["loss"]


def interleaved_training(model, tokens) -> dict:
    """release.npz's arrays of the recurrent GPT's training step (`training_step`): without the KV refresh
    (the release's default) "train_logits:<pass>", "pass_losses", "loss" and "grad:<key>" for every
    parameter; with it (interleaved_kv_refresh=True) "refresh_logits:<pass>", "refresh_pass_losses" and
    "refresh_loss"."""
    model.zero_grad(set_to_none=True)
    plain, loss = training_step(model, tokens, kv_refresh=False)
    loss.backward()
    arrays = {("train_" if key.startswith("logits:") else "") + key: value for key, value in plain.items()}
    arrays |= {f"grad:{name}": p.grad.numpy() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    refreshed, _ = training_step(model, tokens, kv_refresh=True)
    return arrays | {f"refresh_{key}": value for key, value in refreshed.items()}


def release_outputs(model, config, engine, tokens, prefill: int = PREFILL) -> dict:
    """The arrays of release.npz (see above) for `tokens`."""
    arrays = {"tokens": tokens.numpy(), "logits": logits_of(model, tokens).numpy()}
    model.zero_grad(set_to_none=True)
    # contiguous, as the release's dataloader gives them: its loss reads targets.view(-1)
    loss = model(tokens[:, :-1].contiguous(), targets=tokens[:, 1:].contiguous())
    loss = loss[0] if isinstance(loss, tuple) else loss  # the LRT fork's (loss, ...), nanochat's loss
    loss.backward()
    arrays["loss"] = loss.detach().numpy()
    arrays |= {f"grad:{name}": p.grad.numpy() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    arrays["decode"] = decode(model, config, engine, tokens, prefill).numpy()
    return arrays


def reload(gpt, checkpoint_manager, checkpoint_dir: Path):
    """The saved model loaded back as the release's build_model loads one, less its tokenizer."""
    import torch

    model_data, _, meta = checkpoint_manager.load_checkpoint(str(checkpoint_dir), 0, torch.device("cpu"))
    with torch.device("meta"):
        model = gpt.GPT(gpt.GPTConfig(**meta["model_config"]))
    model.to_empty(device="cpu")
    model.init_weights()  # the rotary tables (non-persistent buffers)
    model.load_state_dict(model_data, strict=True, assign=True)
    return model.eval()


def make(out: Path, src: str, size: Size = SIZES["tiny"]) -> None:
    import numpy as np
    import torch

    gpt, checkpoint_manager, engine = import_release(src)
    commit = release_commit(src)
    model, config = build(gpt, size)
    checkpoint_manager.save_checkpoint(
        str(out / "model"),
        step=0,
        model_data=model.state_dict(),
        optimizer_data=None,
        meta_data={"model_config": dataclasses.asdict(config), "step": 0, "release_commit": commit},
    )
    tokens = torch.from_numpy(np.random.default_rng(SEED).integers(0, config.vocab_size, size.tokens))
    if size.interleaved:  # its inference: the sequential loop, which is also its cached decode
        arrays = {"tokens": tokens.numpy(), "logits": sequential(model, config, engine, tokens).numpy()}
        arrays |= interleaved_training(model, tokens)
        (np.savez_compressed if size.compressed else np.savez)(out / "release.npz", **arrays)
        again = sequential(reload(gpt, checkpoint_manager, out / "model"), config, engine, tokens)
        assert torch.equal(again, torch.from_numpy(arrays["logits"])), "reload differs"
        print(
            f"wrote {out}/model and {out}/release.npz (release {commit[:7]}, interleaved, training loss "
            f"{arrays['loss']:.6f} over {config.interleaved_num_passes} interleaved passes; reload equal)"
        )
        return
    arrays = release_outputs(model, config, engine, tokens, size.prefill)
    (np.savez_compressed if size.compressed else np.savez)(out / "release.npz", **arrays)

    reloaded = reload(gpt, checkpoint_manager, out / "model")
    assert torch.equal(logits_of(reloaded, tokens), torch.from_numpy(arrays["logits"])), "reload differs"
    for key, value in model.state_dict().items():
        print(f"  {key:40s} {tuple(value.shape)} {value.dtype}")
    print(f"  window sizes {model.window_sizes}; rotary tables {model.cos.dtype} {tuple(model.cos.shape)}")
    gap = np.abs(arrays["decode"] - arrays["logits"]).max()
    print(
        f"wrote {out}/model and {out}/release.npz (release {commit[:7]}, loss {arrays['loss']:.6f}, "
        f"{len(model.state_dict())} tensors, max |decode - logits| {gap:.2e}; reload's logits equal)"
    )


def export_logits(out: Path, src: str, checkpoint_dir: Path, tokens_from: Path) -> None:
    """<out>/export_logits.npz: the release's logits of the checkpoint at `checkpoint_dir` (loaded as its
    build_model loads one) on the `tokens` of the .npz `tokens_from`."""
    import numpy as np
    import torch

    gpt, checkpoint_manager, engine = import_release(src)
    with np.load(tokens_from) as npz:
        tokens = torch.from_numpy(npz["tokens"])
    model = reload(gpt, checkpoint_manager, checkpoint_dir)
    if getattr(model.config, "use_interleaved", False):  # karpathy/nanochat's GPTConfig has no such field
        logits = sequential(model, model.config, engine, tokens).numpy()
    else:
        logits = logits_of(model, tokens).numpy()
    write_export_logits(out, src, checkpoint_dir, logits)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    run_under(args.release_python, __spec__.name, argv)
    logging.disable(logging.INFO)  # the release logs every save at INFO
    if args.logits_of:
        export_logits(Path(args.out), args.release_src, Path(args.logits_of), Path(args.tokens_from))
    else:
        make(Path(args.out), args.release_src, SIZES[args.size])


if __name__ == "__main__":
    main()
