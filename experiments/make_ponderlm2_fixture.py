#!/usr/bin/env python
"""Makes tests/interop/fixtures/ponderlm2_release/: a tiny random PonderLM-2 built, saved and run by the
release's OWN code (LUMIA-Group/PonderLM-2, a LLaMA-Factory fork: its Llama model in
src/llamafactory/model/modeling/modeling_llama.py, imported from --release_src, never copied), so that our
importer can be checked against it without the checkout. It is also the release-side driver of
tools/release_parity.py (--size 410m, --logits_of; see the end).

The model is the release's LlamaForCausalLM (the class its llama_patch swaps into transformers) with the
fields its loader.load_model sets on the config from its scripts' flags (scripts/train_ponderlm2_*.sh):
recurrent_model=True, scale_embeds=True, interpolation=False (embeddings x sqrt(2.5 H)), the
num_latent_thoughts K of the size, num_jacobi_iterations=3, random_jacobi_iterations=True,
interpolation_use_topk=False. Attention is transformers' SDPA (the scripts ask for flash-attention 2,
which needs CUDA; LLaMA-Factory's "auto" gives SDPA on a CPU): the release's cached decode relies on
SDPA / flash-attention dropping the causal mask of a one-slot query (it passes every stage the token's
cache_position, which an eager mask would get wrong). No other shim: the module imports as it is.

Sizes:
  tiny   LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=96, num_hidden_layers=2,
         num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=0.1 (the release's configs' value),
         tie_word_embeddings=False), K = 2 (so that the growing initialisation has a second pass); tokens
         2 x 8, prefill 2.
  410m   llama_config/410m/config.json (24 layers, width 1024, 16 heads, vocab 50304; ~405M parameters),
         K = 1 as scripts/train_ponderlm2_llama_410m.sh, the smallest model a PonderLM-2 script trains;
         tokens 1 x 16, prefill 2.
  tiny_loop  the tiny config with the release's loop baseline (--patch_method loop: its
         modeling_llama_loop.py runs the whole stack K + 1 times on embeddings x sqrt(2.5 H), whatever
         scale_embeds says), K = 3 as scripts/train_loop_llama_410m.sh, the same flags on its config;
         tests/interop/fixtures/ponderlm2_release_loop/. Its config.json is the same as PonderLM-2's (the
         release does not record --patch_method), so release.npz records `method`.
  410m_loop  llama_config/410m with the loop baseline at K = 3, as scripts/train_loop_llama_410m.sh;
         tokens 1 x 16, prefill 2. (The pause baseline's only script trains 1.4b: tiny_pause only.)
Built as the release builds one (torch.manual_seed(0); LlamaForCausalLM(config), its _init_weights),
then every parameter redrawn from the same stream so that nothing is zero or identity: embed_tokens
N(0, 0.1); every Linear weight and lm_head N(0, 0.1 sqrt(64 / H)); the RMSNorm weights 1 + N(0, 0.1).
(Twice that Linear scale makes the K + 1 + R chained passes chaotic: the release's own fp32 and float64
logits then differ by 4e-5 of their scale, past any fp32 parity check; at this one, by 4e-7.)
Saved with its save_pretrained (safetensors) into <out>/model/: config.json holds the fields above.
<out>/release.npz holds, for tokens = np.random.default_rng(0).integers(2, V, shape) (ids 0 and 1 are the
configs' bos / pad: nn.Embedding(padding_idx=1) zeroes row 1's gradient, which no real text reaches):
  tokens        int64 [B, T]
  jacobi        the refinement count R the training forward drew (torch.randint(2, 4) under
                torch.manual_seed(0), random_jacobi_iterations=True as the scripts)
  logits        the training forward (model.train(), same seed: K growing passes, R refinements, the final
                pass) at every vocabulary token's last slot [B, T, V] float32
  loss          its loss with labels=tokens (transformers' shifted mean cross-entropy)
  grad:<key>    that loss's gradient for every parameter, by its safetensors key
  eval_logits   the evaluation forward (model.eval(): R = num_jacobi_iterations = 3) [B, T, V]
  method        "ponderlm2" or "loop" (the modeling file that made it)
  decode        its cached generation, as GenerationMixin calls it: a prefill of `prefill` tokens through
                an empty DynamicCache (its parallel prefill path; the last position's logits), then one
                token per call (teacher forced; position_ids and cache_position of the token, K + 1 cached
                forwards each) [B, T - prefill + 1, V]. The loop baseline's generation keeps no KV cache:
                each step runs the whole prefix (the last position's logits, from the prefill's on)
(The loop baseline draws no R: its training and evaluation forwards are the one forward.)
Before it returns, the saved folder is loaded back with the release class's from_pretrained and its
training-forward logits must equal `logits` exactly.

  /tmp/pl2venv/bin/python -m experiments.make_ponderlm2_fixture --release_src /tmp/pl2src

(run from the repo root, --release_python defaulting to this Python: it needs torch and transformers
<= 4.46.1, the release's pin, plus safetensors; the fixture was made so from commit fa784be, torch 2.13 CPU,
transformers 4.46.1.) It re-runs itself under --release_python and imports nothing of ours there.

--logits_of DIR --tokens_from NPZ loads the folder DIR (e.g. an export of ours) with the release class's
from_pretrained and writes <out>/export_logits.npz: `logits`, its training forward (seeded as above) on
NPZ's `tokens`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

from experiments.release_python import parse_driver_args, run_under, write_export_logits

ROOT = Path(__file__).resolve().parents[1]
SEED = 0
MODELING = "src/llamafactory/model/modeling/modeling_llama.py"
# The file each --patch_method swaps in (llama_patch.py): PonderLM-2 ("ours") and the loop baseline.
METHODS = {
    "ponderlm2": MODELING,
    "loop": "src/llamafactory/model/modeling/modeling_llama_loop.py",
    "pause": "src/llamafactory/model/modeling/modeling_llama_pause.py",
}
RELEASE_FILES = (MODELING, "src/llamafactory/model/llama_patch.py", "llama_config/410m/config.json")
RELEASE_MARK = "num_latent_thoughts"  # read by its modeling_llama.py, not by transformers' own
TINY = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    rms_norm_eps=0.1,
    tie_word_embeddings=False,
    bos_token_id=0,
    eos_token_id=0,
    pad_token_id=1,
)
# What the release's loader sets on the config from its scripts' flags (hparams/model_args.py -> loader.py).
PONDER = dict(
    recurrent_model=True,
    scale_embeds=True,
    interpolation=False,
    interpolation_use_topk=False,
    num_jacobi_iterations=3,
    random_jacobi_iterations=True,
)


class Size(NamedTuple):
    """A model the driver makes: LlamaConfig fields (or a release config folder), its thought count K,
    the tokens' shape (rows x tokens), the decode's prefill, whether release.npz is compressed, and the
    release's method (a METHODS key)."""

    config: dict | str
    thoughts: int
    tokens: tuple[int, int]
    prefill: int
    compressed: bool
    method: str = "ponderlm2"


SIZES = {
    "tiny": Size(TINY, 2, (2, 8), 2, True),
    "410m": Size("llama_config/410m", 1, (1, 16), 2, False),
    "tiny_loop": Size(TINY, 3, (2, 8), 2, True, "loop"),  # K = 3 as scripts/train_loop_llama_410m.sh
    "410m_loop": Size("llama_config/410m", 3, (1, 16), 2, False, "loop"),  # that script's model
    # K = 3 as scripts/train_pause_llama_1_4b.sh; its pause id (50288 by default) in the tiny vocabulary
    "tiny_pause": Size({**TINY, "pause_token_id": 63}, 3, (2, 8), 2, True, "pause"),
}


def check_release(src: str, python: str) -> None:
    """A checkout of the release and an executable Python to run it, else one ValueError line."""
    if not Path(src).is_dir():
        raise ValueError(f"--release_src {src}: no such directory")
    missing = [name for name in RELEASE_FILES if not (Path(src) / name).is_file()]
    if missing:
        raise ValueError(
            f"--release_src {src} is not a checkout of LUMIA-Group/PonderLM-2 (no {', '.join(missing)})"
        )
    if RELEASE_MARK not in (Path(src) / MODELING).read_text(encoding="utf-8", errors="replace"):
        raise ValueError(f"--release_src {src}: its {MODELING} has no {RELEASE_MARK} (not PonderLM-2's)")
    if not os.access(python, os.X_OK) or Path(python).is_dir():
        raise ValueError(f"--release_python {python} is not an executable")


def import_release(src: str, method: str = "ponderlm2"):
    """The release's modeling module of `method`, loaded from its file (its package's __init__ pulls in
    the whole of LLaMA-Factory, which the model does not need)."""
    spec = importlib.util.spec_from_file_location(f"{method}_modeling_llama", Path(src) / METHODS[method])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--release_src", required=True, help="a checkout of LUMIA-Group/PonderLM-2")
    parser.add_argument(
        "--release_python",
        default=sys.executable,
        help="a Python with torch, transformers<=4.46.1 and safetensors (default: this one)",
    )
    parser.add_argument("--size", default="tiny", choices=sorted(SIZES), help="the model (default tiny)")
    return parse_driver_args(
        parser, argv, check_release, ROOT / "tests/interop/fixtures/ponderlm2_release", "tiny"
    )


def redraw(model) -> None:
    """Every parameter drawn anew from the global (seeded) stream (module docstring); a draw of exactly 0
    is set to 1e-3, so that nothing is zero."""
    import torch

    linear_std = 0.1 * (64 / model.config.hidden_size) ** 0.5
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "model.embed_tokens.weight":
                p.copy_(0.1 * torch.randn_like(p))
            elif name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif name.endswith("proj.weight") or name == "lm_head.weight":
                p.copy_(linear_std * torch.randn_like(p))
            else:
                raise AssertionError(f"no draw for parameter {name}")
            p.masked_fill_(p == 0, 1e-3)


def build(modeling, src: str, size: Size):
    """The release's PonderLM-2 at `size`, built as its loader builds one, then redrawn."""
    import torch
    from transformers import LlamaConfig

    if isinstance(size.config, str):
        config = LlamaConfig.from_pretrained(Path(src) / size.config)
    else:
        config = LlamaConfig(**size.config)
    for name, value in {**PONDER, "num_latent_thoughts": size.thoughts}.items():
        setattr(config, name, value)
    config.torch_dtype = torch.float32
    config._attn_implementation = "sdpa"
    torch.manual_seed(SEED)
    model = modeling.LlamaForCausalLM(config)
    redraw(model)
    return model


def jacobi_draw() -> int:
    """The refinement count the seeded training forward draws (its first random call)."""
    import torch

    torch.manual_seed(SEED)
    return torch.randint(2, 4, (1,)).item()


def training_forward(model, tokens, labels=None):
    """model.train()'s forward (the release's training path) with its Jacobi count drawn under SEED."""
    import torch

    model.train()
    torch.manual_seed(SEED)
    return model(input_ids=tokens, labels=labels)


def decode(model, tokens, prefill: int):
    """Logits of the release's cached generation: the prefill through an empty DynamicCache, then one
    token per call with its position_ids and cache_position, as GenerationMixin passes them."""
    import torch
    from transformers.cache_utils import DynamicCache

    model.eval()
    b = tokens.size(0)
    with torch.no_grad():
        out = model(input_ids=tokens[:, :prefill], past_key_values=DynamicCache(), use_cache=True)
        logits, cache = [out.logits], out.past_key_values
        for t in range(prefill, tokens.size(1)):
            out = model(
                input_ids=tokens[:, t : t + 1],
                past_key_values=cache,
                position_ids=torch.full((b, 1), t),
                cache_position=torch.tensor([t]),
                use_cache=True,
            )
            logits.append(out.logits)
            cache = out.past_key_values
    return torch.cat(logits, dim=1)


def recomputed_decode(model, tokens, prefill: int):
    """The loop baseline's generation: its recurrent forward keeps no KV cache, so every step runs the
    whole prefix; the logits of its last position from the prefill's on."""
    import torch

    model.eval()
    with torch.no_grad():
        steps = [model(input_ids=tokens[:, :t]).logits[:, -1:] for t in range(prefill, tokens.size(1) + 1)]
    return torch.cat(steps, dim=1)


def release_outputs(model, tokens, prefill: int, method: str = "ponderlm2") -> dict:
    """The arrays of release.npz (module docstring) for `tokens`."""
    import numpy as np
    import torch

    arrays = {"tokens": tokens.numpy(), "jacobi": np.array(jacobi_draw())}
    model.zero_grad(set_to_none=True)
    out = training_forward(model, tokens, labels=tokens)
    out.loss.backward()
    arrays["logits"] = out.logits.detach().numpy()
    arrays["loss"] = out.loss.detach().numpy()
    arrays |= {f"grad:{name}": p.grad.numpy() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    model.eval()
    with torch.no_grad():
        arrays["eval_logits"] = model(input_ids=tokens).logits.numpy()
    arrays["decode"] = (decode if method == "ponderlm2" else recomputed_decode)(
        model, tokens, prefill
    ).numpy()
    arrays["method"] = np.array(method)
    return arrays


def reload(modeling, folder: Path):
    """A saved folder loaded back with the release class's from_pretrained (SDPA, fp32)."""
    import torch

    return modeling.LlamaForCausalLM.from_pretrained(
        folder, attn_implementation="sdpa", torch_dtype=torch.float32
    )


def release_commit(src: str) -> str:
    return subprocess.run(
        ["git", "-C", src, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


def make(out: Path, src: str, size: Size) -> None:
    import numpy as np
    import torch

    modeling = import_release(src, size.method)
    commit = release_commit(src)
    model = build(modeling, src, size)
    model.save_pretrained(out / "model", safe_serialization=True)
    (out / "model" / "release_commit.txt").write_text(commit + "\n")
    v = model.config.vocab_size
    high = getattr(model.config, "pause_token_id", v)  # the pause baseline's id is no text token
    tokens = torch.from_numpy(np.random.default_rng(SEED).integers(2, high, size.tokens))
    arrays = release_outputs(model, tokens, size.prefill, size.method)
    (np.savez_compressed if size.compressed else np.savez)(out / "release.npz", **arrays)
    with torch.no_grad():
        again = training_forward(reload(modeling, out / "model"), tokens).logits
    assert torch.equal(again, torch.from_numpy(arrays["logits"])), "reload differs"
    config = json.loads((out / "model" / "config.json").read_text())
    print(f"  config.json: {json.dumps({k: config[k] for k in (*PONDER, 'num_latent_thoughts')})}")
    print(
        f"wrote {out}/model and {out}/release.npz (release {commit[:7]}, K {size.thoughts}, R "
        f"{int(arrays['jacobi'])}, loss {float(arrays['loss']):.6f}, "
        f"{sum(k.startswith('grad:') for k in arrays)} gradients; reload's logits equal)"
    )


def export_logits(out: Path, src: str, folder: Path, tokens_from: Path) -> None:
    """<out>/export_logits.npz: the release's training-forward logits of the folder `folder` (loaded with
    its from_pretrained) on the `tokens` of the .npz `tokens_from`."""
    import numpy as np
    import torch

    with np.load(tokens_from) as npz:
        tokens = torch.from_numpy(npz["tokens"])
        modeling = import_release(src, str(npz["method"]))
    with torch.no_grad():
        logits = training_forward(reload(modeling, folder), tokens).logits.numpy()
    write_export_logits(out, src, folder, logits)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    run_under(args.release_python, __spec__.name, argv)
    if args.logits_of:
        export_logits(Path(args.out), args.release_src, Path(args.logits_of), Path(args.tokens_from))
    else:
        make(Path(args.out), args.release_src, SIZES[args.size])


if __name__ == "__main__":
    main()
