"""The README.md of an exported folder: what the model is, where it came from, how to load it, and how
closely it matched our JAX model when `--verify` ran."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np

from t2mlr_jax.interop.verify import report_sections
from t2mlr_jax.model.config import ModelConfig

LAYOUT_NAMES = {
    "hf": "HF Llama format",
    "t2mlr-torch": "the authors' PyTorch T²MLR layout",
    "nanochat": "nanochat's checkpoint format (model_<step>.pt + meta_<step>.json)",
    "ponderlm2": "PonderLM-2's release format (an HF Llama folder with its pondering fields in config.json)",
}
MODES = {
    "exact": "exact recurrence",
    "plain": "plain forward",
    "ponderlm2": "arch ponderlm2, the release's evaluation forward",
}


def write_model_card(
    folder: Path | str,
    cfg: ModelConfig,
    params: dict,
    *,
    layout: str,
    source: str,
    source_format: str,
    tokenizer: str | None,
    report: dict | None = None,
) -> None:
    """`cfg` is the converted model, its recurrence included even where the export dropped it; `params`
    what the folder holds; `report` the `verify` report, if it ran."""
    folder = Path(folder)
    num_params = sum(int(np.prod(np.shape(x))) for x in jax.tree.leaves(params))
    sections = [
        _summary(folder, cfg, layout, source, source_format, tokenizer),
        _architecture(cfg, num_params),
        _recurrence(cfg, dropped=layout in ("hf", "nanochat")) if cfg.recurrence else "",
        _loading(folder, layout, tokenizer),
        _verification(report),
    ]
    (folder / "README.md").write_text("\n\n".join(s for s in sections if s) + "\n", encoding="utf-8")


def _summary(
    folder: Path, cfg: ModelConfig, layout: str, source: str, source_format: str, tokenizer: str | None
) -> str:
    if layout == "t2mlr-torch":
        what = "A T²MLR model (a Llama backbone with temporal latent recurrence)"
    elif layout == "nanochat":
        what = "A nanochat GPT" + (
            " (the backbone of a T²MLR model, its recurrence dropped)" if cfg.recurrence else ""
        )
    elif layout == "ponderlm2":
        what = "A PonderLM-2 model (LUMIA-Group/PonderLM-2: a Llama with latent thought slots)"
    elif cfg.recurrence:
        what = "The transformer backbone of a T²MLR model (its recurrence dropped)"
    else:
        what = "A Llama-architecture causal language model"
    tokenizer_line = (
        f"`{tokenizer}`"
        if tokenizer
        else "none: this folder has no tokenizer files (convert again with `--tokenizer PATH`)"
    )
    return (
        f"# {folder.name}\n\n{what}, in {LAYOUT_NAMES[layout]}, written by t2mlr-jax's "
        f"`tools/convert_checkpoint.py`.\n\n"
        f"- Source checkpoint: `{source}` ({source_format})\n- Tokenizer: {tokenizer_line}"
    )


def _architecture(cfg: ModelConfig, num_params: int) -> str:
    rows = [
        ("layers", cfg.num_layers),
        ("width (hidden size)", cfg.hidden_size),
        ("attention heads", f"{cfg.num_heads} query, {cfg.num_kv_heads} key/value, head dim {cfg.head_dim}"),
        ("MLP width", cfg.mlp_dim),
        ("vocabulary", cfg.vocab_size),
        ("parameters", f"{num_params:,}"),
        ("tied embeddings", "yes" if cfg.tie_embeddings else "no"),
        ("context length", cfg.max_seq_len),
    ]
    return "## Architecture\n\n| | |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)


def _recurrence(cfg: ModelConfig, *, dropped: bool) -> str:
    rec = cfg.recurrence
    l_start, l_end = cfg.layer_range
    note = (
        "This folder holds the backbone alone (`--drop-recurrence`): it computes the model with the "
        "recurrence off (γ = 0), not the trained T²MLR model. The recurrence it was trained with:\n\n"
        if dropped
        else ""
    )
    cache = (
        f"temporal residual R_t = N(h_t + w R_(t-1)), w = {rec.temporal_residual_weight:g}, "
        f"N = {rec.cache_norm}"
        if rec.temporal_residual
        else "the raw stream after block l_end"
    )
    return (
        f"## Recurrence (T²MLR)\n\n{note}"
        f"- Layers: paper notation ({l_start + 1}, {l_end + 1}) (1-based, inclusive) = our code's "
        f"l_start={l_start}, l_end={l_end} (0-based blocks): the cache R is read after block l_end of token "
        f"t-1 and fused into the stream entering block l_start of token t\n"
        f"- Mixer: `{rec.mixer}` (γ {'per channel' if rec.gamma_per_channel else 'scalar'})\n"
        f"- Cache: {cache}\n"
        f"- Jacobi depths of the parallel training forward: D = {rec.d_forward}, B = {rec.d_backward}"
    )


def _loading(folder: Path, layout: str, tokenizer: str | None) -> str:
    if layout == "t2mlr-torch":
        intro = (
            'transformers alone cannot build this model (model_type "t2mlr"): load it with the authors\' '
            "code (github.com/princeton-pli/T2MLR, `T2MLRWrapper`) or t2mlr-jax's PyTorch reference "
            "(exact recurrence, token by token):"
        )
        lines = [
            "from transformers import AutoTokenizer",
            "from t2mlr_jax.architectures.t2mlr.torch_reference import T2MLRReference",
            "",
            f'tokenizer = AutoTokenizer.from_pretrained("{folder}")',
            f'model = T2MLRReference.from_pretrained("{folder}")',
            'logits = model(tokenizer("The capital of France is", return_tensors="pt").input_ids)',
        ]
    elif layout == "nanochat":
        intro = (
            "With nanochat's own code (karpathy/nanochat or the LRT release: `checkpoint_manager.build_model`"
            ", its tokenizer from nanochat's base dir), or t2mlr-jax's PyTorch reference:"
        )
        lines = [
            "import torch",
            "from t2mlr_jax.formats.nanochat_torch import NanochatReference",
            "",
            f'model = NanochatReference.from_checkpoint("{folder}")',
            "logits = model(torch.tensor([[1, 2, 3]]))",
        ]
        tokenizer = "nanochat's"  # not part of its checkpoints: nothing missing
    elif layout == "ponderlm2":
        intro = (
            "With the release's code (github.com/LUMIA-Group/PonderLM-2: its llama_patch swaps its "
            "LlamaForCausalLM into transformers <= 4.46.1), or t2mlr-jax's PyTorch reference of its "
            "evaluation forward:"
        )
        lines = [
            "import torch",
            "from t2mlr_jax.architectures.ponderlm2.torch_reference import PonderLM2Reference",
            "",
            f'model = PonderLM2Reference.from_pretrained("{folder}")',
            "logits = model(torch.tensor([[2, 3, 4]]))",
        ]
    else:
        intro = "With transformers (generation stops at the tokenizer's EOS):"
        lines = [
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            "",
            f'tokenizer = AutoTokenizer.from_pretrained("{folder}")',
            f'model = AutoModelForCausalLM.from_pretrained("{folder}")',
            'inputs = tokenizer("The capital of France is", return_tensors="pt")',
            "print(tokenizer.decode(model.generate(**inputs, max_new_tokens=20)[0]))",
        ]
    code = "```python\n" + "\n".join(lines) + "\n```"
    missing = (
        ""
        if tokenizer
        else "\n\nThe tokenizer lines need tokenizer files, which this folder lacks: convert again with "
        "`--tokenizer PATH`."
    )
    return f"## Loading\n\n{intro}\n\n{code}{missing}"


def _verification(report: dict | None) -> str:
    if report is None:
        return (
            "## Verification\n\nNot verified: convert with `--verify` (and `--verify-text FILE`) to compare "
            "its logits with our JAX model's."
        )
    rows = [
        f"| {name} | {r['num_sequences']} × {r['seq_len']} | {r['max_abs_logit_diff']:.3g} | "
        f"{r['max_rel_logit_diff']:.3g} | {r['tolerance']:g} | {'passed' if r['passed'] else 'FAILED'} |"
        for name, r in report_sections(report)
    ]
    return (
        f"## Verification\n\n`--verify` ran our JAX model ({MODES[report['mode']]}) and this folder in "
        "PyTorch on the same tokens (relative: the difference over the largest absolute logit):\n\n"
        "| tokens | sequences × length | max abs logit difference | relative | tolerance | result |\n"
        "|---|---|---|---|---|---|\n" + "\n".join(rows)
    )
