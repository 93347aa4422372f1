"""The release's side of experiments/vs_release.py: run by the release's Python (torch, transformers 4.57) in
a process of its own, it builds the authors' T2MLRWrapper (princeton-pli/T2MLR, imported from the checkout
at spec["release_src"], never copied) at the spec's shapes, times its train step and HF generate(), then
the same for the backbone with T²MLR off, and prints one JSON line (see `main`). Imports nothing of ours.

The model is built as the release's src/train.py builds it from scratch (LlamaForCausalLM.from_config, then
T2MLRWrapper.from_base_model) with scripts/fineweb/train_fineweb.sh's T²MLR settings plus the spec's
window, Jacobi D / B and temporal residual (its sweep_params.yaml turns that on); fp32, SDPA attention.

  <release python> -m experiments.benchmarks.vs_release_torch '<spec json>'   # from the repo root
"""

import functools
import os
import sys
import time
import types
from pathlib import Path

from t2mlr_jax.studies.benchmarks.side_by_side import pin_threads, programs_of, result, timed_calls

ENTRY_POINT = "experiments.benchmarks.vs_release_torch"  # its command: python -m ENTRY_POINT
RELEASE_ENTRY = "src/t2mlr_wrapper/t2mlr_wrapper.py"  # what marks a checkout of the release
REPO = "princeton-pli/T2MLR"
HOW_TO = """\
vs_release.py times the authors' PyTorch release against this framework; it needs their code:
  git clone https://github.com/princeton-pli/T2MLR ../T2MLR
  python3 -m venv ../release_venv
  ../release_venv/bin/pip install torch==2.13.0 'transformers==4.57.*' accelerate
  python -m experiments.vs_release --release_src=../T2MLR --release_python=../release_venv/bin/python
The release does not import as shipped; its driver (this module) applies two
import shims in its own process, via sys.modules:
  sys.modules["IPython"] = a stub module with embed()
  sys.modules["components.t2mlr_utils"] = components.rcot_utils"""


def check_release(src: str, python: str) -> None:
    """A checkout of the release and an executable Python to run it, else one ValueError line."""
    if not Path(src).is_dir():
        raise ValueError(f"--release_src {src}: no such directory")
    if not (Path(src) / RELEASE_ENTRY).is_file():
        raise ValueError(f"--release_src {src} is not a checkout of princeton-pli/T2MLR (no {RELEASE_ENTRY})")
    if not os.access(python, os.X_OK) or Path(python).is_dir():
        raise ValueError(f"--release_python {python} is not an executable")


def check_transformers() -> None:
    """The release runs on transformers 4.56/4.57 only: else exit naming this Python's version."""
    import transformers

    version = tuple(int(x) for x in transformers.__version__.split(".")[:2])
    if not (4, 56) <= version < (4, 58):
        raise SystemExit(
            f"the release needs transformers 4.56/4.57; {sys.executable} has {transformers.__version__}: "
            "pip install torch==2.13.0 'transformers==4.57.*' accelerate in a separate venv"
        )


def import_release(src: str):
    """The release's wrapper and its arguments class. It does not import as shipped: `IPython` (an unused
    `embed` import) gets a stub module, and `components.t2mlr_utils` is `components.rcot_utils` renamed."""
    sys.path.insert(0, str(Path(src) / "src"))
    ipython = types.ModuleType("IPython")
    ipython.embed = lambda *args, **kwargs: None
    sys.modules.setdefault("IPython", ipython)
    import components.rcot_utils

    sys.modules["components.t2mlr_utils"] = components.rcot_utils
    from components.all_arguments import T2MLRArguments
    from t2mlr_wrapper import T2MLRWrapper

    return T2MLRArguments, T2MLRWrapper


def llama_config(LlamaConfig, m: dict, **fields):
    """A transformers LlamaConfig of the spec's model fields (vs_release_ours.MODEL_FIELDS), fp32, SDPA."""
    import torch

    return LlamaConfig(
        vocab_size=m["vocab_size"],
        hidden_size=m["hidden_size"],
        intermediate_size=m["mlp_dim"],
        num_hidden_layers=m["num_layers"],
        num_attention_heads=m["num_heads"],
        num_key_value_heads=m["num_kv_heads"],
        head_dim=m["head_dim"],
        rms_norm_eps=m["norm_eps"],
        rope_theta=m["rope_theta"],
        tie_word_embeddings=m["tie_embeddings"],
        initializer_range=m["init_std"],
        max_position_embeddings=m["max_seq_len"],
        dtype=torch.float32,
        attn_implementation="sdpa",
        **fields,
    )


def build(spec: dict, t2mlr: bool, release):
    """(wrapper, parameters of the model it trains). T²MLR off is the release's own baseline (its sweep's
    t2mlr_off runs): the same wrapper, whose regular forward is the plain backbone."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    T2MLRArguments, T2MLRWrapper = release
    m, r = spec["model"], spec["recurrence"]
    torch.manual_seed(spec["seed"])
    base = LlamaForCausalLM(llama_config(LlamaConfig, m))
    backbone_params = sum(p.numel() for p in base.parameters())
    args = T2MLRArguments(
        t2mlr_enabled=t2mlr,
        l_start=r["l_start"],
        l_end=r["l_end"],
        recurrent_mixing_module_name="gated",
        use_recurrent_projection=True,
        recurrent_state_proj_type="linear",
        use_learnable_gate=True,
        gate_weight_init_std=r["gate_weight_init_std"],
        recurrent_weight=0.5,
        orig_weight=0.5,
        recurrent_residual_to_recurrent_cache=r["temporal_residual"],
        recurrent_residual_to_recurrent_cache_weight=r["temporal_residual_weight"],
        recurrent_residual_to_recurrent_cache_post_norm=True,
        recurrent_residual_to_recurrent_cache_post_norm_clamp=r["cache_norm_clamp"],
        batch_forward=True,
        batch_forward_approximate_depth=r["d_forward"],
        batch_backward_approximate_depth=r["d_backward"],
    )
    model = T2MLRWrapper.from_base_model(base, args)
    model.control_flow_all_recurrent = True  # the fineweb script's --control_flow_all_recurrent
    params = sum(p.numel() for p in model.parameters()) if t2mlr else backbone_params
    return model, params


def measure(spec: dict, t2mlr: bool, release) -> dict:
    """One model's train step (forward + backward + clipped AdamW step, as the release's Trainer runs it)
    and greedy generate() (exact prefill of a recurrent prompt, then cached single-token steps)."""
    import torch
    import torch.nn.functional as F

    model, params = build(spec, t2mlr, release)

    def loss_of(ids):
        flows = {"control_flows": torch.full_like(ids, 2)} if t2mlr else {}  # 2 = recurrent (fineweb runs)
        positions = torch.arange(ids.shape[1])[None].expand_as(ids)

        def loss():
            out = model(input_ids=ids, attention_mask=torch.ones_like(ids), position_ids=positions, **flows)
            return F.cross_entropy(out.logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())

        return loss

    # the wrapper's train(): the Jacobi ("batch approximate") forward; the prompt recurrent too, prefilled
    # by exact recurrence
    return train_and_generate(spec, model, params, loss_of, recurrence_in_prompt=True)


def train_and_generate(spec: dict, model, params: int, loss_of, **generate_kwargs) -> dict:
    """An HF model's train step and greedy generate(), timed: `loss_of(ids)` gives the step's loss function
    on the spec's train rows, whose gradient the step clips and applies with fused AdamW (HF Trainer's
    default optimizer for torch >= 2.8, adamw_torch_fused, at the spec's settings); generate() runs in
    eval mode on the spec's prompt, `generate_kwargs` added. {"train": ..., "decode": ...}."""
    import numpy as np
    import torch

    train, decode, o = spec["train"], spec["decode"], spec["optimizer"]
    shape = (max(train["batch"], decode["batch"]), train["seq_len"] + 1)
    rows = np.random.default_rng(spec["seed"]).integers(1, spec["model"]["vocab_size"], shape)
    loss = loss_of(torch.from_numpy(rows[: train["batch"], : train["seq_len"]]))
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=o["lr"],
        betas=(o["b1"], o["b2"]),
        eps=o["eps"],
        weight_decay=o["weight_decay"],
        fused=True,
    )

    def train_step():
        value = loss()
        value.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), o["grad_clip"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(value.detach())

    model.train()
    train_seconds, first_loss = timed_calls(train_step, spec["repeats"])
    model.eval()
    prompt = torch.from_numpy(rows[: decode["batch"], : decode["prompt_len"]])
    n = decode["new_tokens"]

    def generate():
        with torch.inference_mode():
            out = model.generate(
                input_ids=prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                use_cache=True,
                pad_token_id=0,
                **generate_kwargs,
            )
        assert out.shape[1] == prompt.shape[1] + n, out.shape
        return out

    decode_seconds, _ = timed_calls(generate, spec["repeats"])
    return {
        "train": {"seconds": train_seconds, "loss": first_loss, "params": params},
        "decode": {"seconds": decode_seconds, "new_tokens": n, "params": params},
    }


def main(spec: dict) -> dict:
    """{"side", "versions", "programs", "peak_rss_bytes", "wall_s"}; programs: t2mlr_train, t2mlr_decode,
    plain_train, plain_decode, each {"seconds": [...], "params", ...}."""
    start = time.perf_counter()
    pin_threads(spec["threads"])
    import logging
    import warnings

    import torch
    import transformers

    check_transformers()
    torch.set_num_threads(spec["threads"])
    release = import_release(spec["release_src"])
    logging.disable(logging.WARNING)  # the release logs every model build at INFO
    transformers.logging.set_verbosity_error()
    warnings.filterwarnings("ignore")
    programs = programs_of(
        {
            name: functools.partial(measure, spec, t2mlr, release)
            for name, t2mlr in (("t2mlr", True), ("plain", False))
        }
    )
    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    return result("release", versions, programs, start)
