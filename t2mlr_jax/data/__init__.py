"""Data for T²MLR: the batch contract, generated tasks, SFT formats, text pretraining pipelines and
model-free evaluation helpers. Names load with their module on first use (PEP 562): importing one data
module (e.g. gguf_metadata) does not load the pipelines' grain, orbax and tokenizers."""

import importlib

_LAZY = {
    "answers": (
        "exact_answer_correct",
        "extract_gsm_answer",
        "gsm_answer_correct",
        "normalize_gsm_answer",
        "pathfinding_path_correct",
        "prosqa_path_correct",
    ),
    "batch": ("BATCH_DTYPES", "PAD", "PROMPT", "RECURRENT", "check_token_ids", "validate_batch"),
    "batching": ("batch_examples",),
    "char_tokenizer": ("S5CharTokenizer",),
    "metrics": ("LengthBinnedAccuracy", "sequence_exact_match", "token_accuracy"),
    "pipeline": (
        "RECORD_FORMATS",
        "document_example",
        "file_batches",
        "load_records",
        "record_encoder",
        "task_batches",
        "text_batches",
    ),
    "sft": ("encode_prompt", "encode_prompt_response", "gsm8k_aug_record", "hotpotqa_record"),
    "tasks": ("TASKS", "GeneratedTaskSource"),
    "tokenizer": ("TextTokenizer", "load_tokenizer", "tokenizer_from_gguf"),
}
_MODULE_OF = {name: module for module, names in _LAZY.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = globals()[name] = getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)  # once
    return value
