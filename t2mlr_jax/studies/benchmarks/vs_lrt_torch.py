"""The LRT release's side of `experiments/vs_release.py --release lrt`: run by the release's Python in a
process of its own, it builds the release's GPTs (OoDBag/Latent_recurrent_transformer, a nanochat fork,
imported from spec["release_src"], never copied) at the spec's shapes, as its scripts/base_train.py does
(GPT(GPTConfig(...)), init_weights(), model.setup_optimizer(): its MuonAdamW at the default learning rates,
whose fused AdamW / Muon steps it torch.compiles), times their train steps and decodes, and prints one
JSON line (see `main`). Imports nothing of ours but the stdlib helpers of side_by_side.py.

  recurrent  GPTConfig(use_interleaved=True, interleaved_num_passes=spec["passes"]); its train step is
             base_train.py's --interleaved step: forward_interleaved_train (one full pass that buffers
             every layer's K / V, then the interleaved passes, pass i recomputing the positions
             pos % N == i against that buffer), backward, optimizer step; its decode is its true recurrence,
             loss_eval.evaluate_bpb_sequential's loop made greedy: a token per forward with its KVCache,
             fed the previous token's h_final, the prompt included (no parallel prefill exists for it)
  vanilla    the same GPTConfig without use_interleaved: model(x, y) (the loss), backward, optimizer step;
             its decode is nanochat.engine.Engine.generate (a batch-1 prefill, then one cached forward per
             token) at temperature 0, with a stub tokenizer: Engine asks it for its special tokens'
             ids (tool use, end of row), here ids no model emits
Both run eagerly, fp32 on the CPU (base_train.py torch.compiles the vanilla model; its interleaved passes
run uncompiled unless --compile-interleaved), as base_train.py does on a CPU (no autocast).

  <release python> -m experiments.benchmarks.vs_lrt_torch '<spec json>'   # from the repo root
"""

import contextlib
import functools
import io
import sys
import time
from pathlib import Path

from t2mlr_jax.studies.benchmarks.side_by_side import pin_threads, programs_of, result, timed_calls
from t2mlr_jax.studies.fixtures import nanochat as make_nanochat_fixture

ENTRY_POINT = "experiments.benchmarks.vs_lrt_torch"  # its command: python -m ENTRY_POINT
REPO = "OoDBag/Latent_recurrent_transformer"
check_release = make_nanochat_fixture.check_release  # vs_release.py's check of the checkout and Python
HOW_TO = """\
vs_release.py --release lrt times the LRT authors' PyTorch release against this framework; it needs their
code and, on the release's side, torch, numpy, filelock and rustbpe + tiktoken (which its
checkpoint_manager imports at module level; no tokenizer is used):
  git clone https://github.com/OoDBag/Latent_recurrent_transformer ../lrt_release
  pip install --target ../relpkgs rustbpe tiktoken
  PYTHONPATH=../relpkgs python -m experiments.vs_release --release lrt --release_src=../lrt_release
No shim: the release imports as shipped (its flash_attention.py falls back to PyTorch SDPA without CUDA)."""


class StubTokenizer:
    """What Engine.generate asks of a tokenizer when nothing it samples is a special token."""

    def encode_special(self, text: str) -> int:
        return -1  # no model emits it: the rows run to max_tokens

    def get_bos_token_id(self) -> int:
        return -1


def import_release(src: str):
    sys.path.insert(0, str(Path(src).resolve()))
    from nanochat.engine import Engine, KVCache
    from nanochat.gpt import GPT, GPTConfig

    return GPT, GPTConfig, Engine, KVCache


def measure(spec: dict, interleaved: bool, release) -> dict:
    """One GPT's train step and greedy decode (module docstring)."""
    import numpy as np
    import torch

    GPT, GPTConfig, Engine, KVCache = release
    torch.manual_seed(spec["seed"])
    config = GPTConfig(**spec["model"], use_interleaved=interleaved, interleaved_num_passes=spec["passes"])
    model = GPT(config)
    model.init_weights()
    params = sum(p.numel() for p in model.parameters())
    optimizer = model.setup_optimizer()
    train, decode = spec["train"], spec["decode"]
    shape = (max(train["batch"], decode["batch"]), train["seq_len"] + 1)
    rows = torch.from_numpy(np.random.default_rng(spec["seed"]).integers(1, config.vocab_size, shape))
    x = rows[: train["batch"], :-1].contiguous()
    y = rows[: train["batch"], 1:].contiguous()

    def train_step():
        if interleaved:
            loss = model.forward_interleaved_train(x, y)["loss"]
        else:
            loss, _ = model(x, y)
        loss.backward()
        optimizer.step()
        model.zero_grad(set_to_none=True)
        return float(loss.detach())

    model.train()
    train_seconds, loss = timed_calls(train_step, spec["repeats"])
    model.eval()
    prompt = rows[: decode["batch"], : decode["prompt_len"]]
    n = decode["new_tokens"]

    @torch.inference_mode()
    def recurrent_decode():
        batch, width, length = prompt.shape[0], config.n_embd, prompt.shape[1] + n
        head_dim = width // config.n_head
        cache = KVCache(batch, config.n_kv_head, length, head_dim, config.n_layer, "cpu", torch.float32)
        h_final = torch.zeros(batch, 1, width)
        out = []
        token = prompt[:, :1]
        for t in range(prompt.shape[1] + n - 1):
            logits, h_final = model(token, kv_cache=cache, h_final_prev=h_final, return_hidden=True)
            if t + 1 < prompt.shape[1]:
                token = prompt[:, t + 1 : t + 2]
            else:
                token = logits[:, -1].argmax(-1, keepdim=True)
                out.append(token)
        return torch.cat(out, 1)

    def vanilla_decode():
        assert prompt.shape[0] == 1, "Engine.generate prefills one prompt"
        engine = Engine(model, StubTokenizer())
        tokens = list(engine.generate(prompt[0].tolist(), num_samples=1, max_tokens=n, temperature=0.0))
        assert len(tokens) == n, len(tokens)
        return tokens

    decode_seconds, _ = timed_calls(recurrent_decode if interleaved else vanilla_decode, spec["repeats"])
    return {
        "train": {"seconds": train_seconds, "loss": loss, "params": params},
        "decode": {"seconds": decode_seconds, "new_tokens": n, "params": params},
    }


def quietly(fn, *args):
    """fn(*args) with its stdout dropped: the release prints its optimizer's settings."""
    with contextlib.redirect_stdout(io.StringIO()):
        return fn(*args)


def main(spec: dict) -> dict:
    """{"side", "versions", "programs", "peak_rss_bytes", "wall_s"}; programs: lrt_train, lrt_decode,
    plain_train, plain_decode, each {"seconds": [...], "params", ...}."""
    start = time.perf_counter()
    pin_threads(spec["threads"])
    import warnings

    import torch

    torch.set_num_threads(spec["threads"])
    warnings.filterwarnings("ignore")
    release = import_release(spec["release_src"])
    programs = programs_of(
        {
            name: functools.partial(quietly, measure, spec, flag, release)
            for name, flag in (("lrt", True), ("plain", False))
        }
    )
    return result("release", {"torch": torch.__version__}, programs, start)
