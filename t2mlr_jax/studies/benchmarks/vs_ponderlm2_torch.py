"""PonderLM-2's release's side of `experiments/vs_release.py --release ponderlm2`: run by the release's
Python (torch, transformers <= 4.46.1) in a process of its own, it builds the release's PonderLM-2 Llama
(LUMIA-Group/PonderLM-2, src/llamafactory/model/modeling/modeling_llama.py from spec["release_src"], never
copied) and the stock transformers Llama (the release's vanilla: its patch leaves it in place) at the
spec's shapes, times their train steps and greedy generate(), and prints one JSON line (see `main`).
Imports nothing of ours but the stdlib helpers.

The PonderLM-2 model is configured as llamafactory/model/loader.py configures it for
scripts/train_ponderlm2_llama_410m.sh (recurrent_model, scale_embeds, no interpolation, K =
num_latent_thoughts = 1), with num_jacobi_iterations = 3 and random_jacobi_iterations off (the script draws
2 or 3 per step): a training forward is one pass over the tokens (the thought's initialisation), 3 Jacobi
passes and the final pass over the 2L interleaved slots, the loss on the final pass, gradients through
every pass; a decoded token is K + 1 = 2 cached forwards, the prompt prefilled by those same 5 passes.
The step: forward, backward, gradient clipping at 1.0 (HF Trainer's max_grad_norm), torch's fused AdamW
(the Trainer's default) at the script's lr 3e-4, betas (0.9, 0.95), weight decay 0.1; fp32, SDPA.

One shim, no code change: modeling_llama.py is loaded by its file path, not through the llamafactory
package, whose __init__ imports the whole trainer stack (peft, trl, datasets, ...); llama_patch.py's swap
(transformers' LlamaForCausalLM := that module's) is then only a name, and the class is used directly.
No flash-attention import is needed: the file imports transformers' _flash_attention_forward, which
transformers 4.46 defines without flash-attn installed, and attention runs through SDPA.

  <release python> -m experiments.benchmarks.vs_ponderlm2_torch '<spec json>'   # from the repo root
"""

import functools
import importlib.util
import os
import sys
import time
from pathlib import Path

from t2mlr_jax.studies.benchmarks.side_by_side import pin_threads, programs_of, result
from t2mlr_jax.studies.benchmarks.vs_release_torch import llama_config, train_and_generate

ENTRY_POINT = "experiments.benchmarks.vs_ponderlm2_torch"  # its command: python -m ENTRY_POINT
REPO = "LUMIA-Group/PonderLM-2"
MODELING = "src/llamafactory/model/modeling/modeling_llama.py"  # also what marks a checkout of the release
HOW_TO = """\
vs_release.py --release ponderlm2 times the PonderLM-2 authors' PyTorch release against this framework; it
needs their code and a Python with torch and transformers <= 4.46.1 (the release's Llama is written
against 4.46's):
  git clone https://github.com/LUMIA-Group/PonderLM-2 ../PonderLM-2
  python3 -m venv ../pl2_venv && ../pl2_venv/bin/pip install torch==2.13.0 transformers==4.46.1
  python -m experiments.vs_release --release ponderlm2 --release_src=../PonderLM-2 \\
      --release_python=../pl2_venv/bin/python
Its driver (this module) loads modeling_llama.py by its file path (the
llamafactory package's __init__ imports its trainer stack); nothing else is shimmed."""


def check_release(src: str, python: str) -> None:
    """A checkout of the release and an executable Python to run it, else one ValueError line."""
    if not Path(src).is_dir():
        raise ValueError(f"--release_src {src}: no such directory")
    if not (Path(src) / MODELING).is_file():
        raise ValueError(f"--release_src {src} is not a checkout of {REPO} (no {MODELING})")
    if not os.access(python, os.X_OK) or Path(python).is_dir():
        raise ValueError(f"--release_python {python} is not an executable")


def import_release(src: str):
    """The release's PonderLM-2 LlamaForCausalLM, its modeling file loaded by path (module docstring)."""
    import transformers

    version = tuple(int(x) for x in transformers.__version__.split(".")[:3])
    if version > (4, 46, 1):
        raise SystemExit(
            f"the release needs transformers <= 4.46.1; {sys.executable} has {transformers.__version__}"
        )
    spec = importlib.util.spec_from_file_location("ponderlm2_modeling_llama", Path(src) / MODELING)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.LlamaForCausalLM


def build(spec: dict, ponder: bool, PonderLM2):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(spec["seed"])
    if not ponder:
        return LlamaForCausalLM(llama_config(LlamaConfig, spec["model"]))
    p = spec["ponder"]
    config = llama_config(
        LlamaConfig,
        spec["model"],
        recurrent_model=True,
        scale_embeds=p["embed_scale"],
        interpolation=False,
        interpolation_use_topk=False,
        num_latent_thoughts=p["thoughts"],
        num_jacobi_iterations=p["jacobi_iterations"],
        random_jacobi_iterations=False,
        output_hidden_states=False,
        classifier_dropout=0,
    )
    return PonderLM2(config)


def measure(spec: dict, ponder: bool, PonderLM2) -> dict:
    """One model's train step and greedy generate() (module docstring)."""
    import torch

    model = build(spec, ponder, PonderLM2)

    def loss_of(ids):
        # HF's loss shifts the labels: the next-token loss of the row
        return lambda: model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids).loss

    return train_and_generate(spec, model, sum(p.numel() for p in model.parameters()), loss_of)


def main(spec: dict) -> dict:
    """{"side", "versions", "programs", "peak_rss_bytes", "wall_s"}; programs: ponder_train, ponder_decode,
    plain_train, plain_decode, each {"seconds": [...], "params", ...}."""
    start = time.perf_counter()
    pin_threads(spec["threads"])
    import warnings

    import torch
    import transformers

    torch.set_num_threads(spec["threads"])
    transformers.logging.set_verbosity_error()
    warnings.filterwarnings("ignore")
    PonderLM2 = import_release(spec["release_src"])
    programs = programs_of(
        {
            name: functools.partial(measure, spec, ponder, PonderLM2)
            for name, ponder in (("ponder", True), ("plain", False))
        }
    )
    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    return result("release", versions, programs, start)
