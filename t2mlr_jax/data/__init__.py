"""Data for T²MLR: the batch contract, generated tasks, SFT formats, text pretraining pipelines and
model-free evaluation helpers."""

from t2mlr_jax.data.answers import (
    exact_answer_correct,
    extract_gsm_answer,
    gsm_answer_correct,
    normalize_gsm_answer,
    pathfinding_path_correct,
    prosqa_path_correct,
)
from t2mlr_jax.data.batch import BATCH_DTYPES, PAD, PROMPT, RECURRENT, check_token_ids, validate_batch
from t2mlr_jax.data.batching import batch_examples
from t2mlr_jax.data.char_tokenizer import S5CharTokenizer
from t2mlr_jax.data.metrics import LengthBinnedAccuracy, sequence_exact_match, token_accuracy
from t2mlr_jax.data.pipeline import (
    RECORD_FORMATS,
    document_example,
    file_batches,
    load_records,
    record_encoder,
    task_batches,
    text_batches,
)
from t2mlr_jax.data.sft import encode_prompt, encode_prompt_response, gsm8k_aug_record, hotpotqa_record
from t2mlr_jax.data.tasks import TASKS, GeneratedTaskSource
from t2mlr_jax.data.tokenizer import TextTokenizer, load_tokenizer, tokenizer_from_gguf

__all__ = [
    "BATCH_DTYPES",
    "PAD",
    "PROMPT",
    "RECORD_FORMATS",
    "RECURRENT",
    "TASKS",
    "GeneratedTaskSource",
    "LengthBinnedAccuracy",
    "S5CharTokenizer",
    "TextTokenizer",
    "batch_examples",
    "check_token_ids",
    "document_example",
    "encode_prompt",
    "encode_prompt_response",
    "exact_answer_correct",
    "extract_gsm_answer",
    "file_batches",
    "gsm8k_aug_record",
    "gsm_answer_correct",
    "hotpotqa_record",
    "load_records",
    "load_tokenizer",
    "normalize_gsm_answer",
    "pathfinding_path_correct",
    "prosqa_path_correct",
    "record_encoder",
    "sequence_exact_match",
    "task_batches",
    "text_batches",
    "token_accuracy",
    "tokenizer_from_gguf",
    "validate_batch",
]
