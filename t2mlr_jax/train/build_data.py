"""config.data -> DataSource, over the grain pipelines of t2mlr_jax.data.

config.data.kind:
  generated  a task generated on the fly (data.task: s5_retrieval | variable_assignment | prosqa |
             pathfinding; data.options: the task's generator fields, e.g. max_actions, value_len)
  file       prompt/response records from files (data.train_path, data.eval_path, data.format:
             gsm8k_aug | hotpotqa | prompt_response | s5_retrieval)
  text       pretraining text (data.train_path, data.eval_path: token stores or raw documents; each a
             path or a comma list of paths; data.packing: documents | concat, see
             t2mlr_jax.data.pipeline), or a prepared TFDS split in their place (data.source,
             data.eval_source: "tfds:NAME[/CONFIG]:SPLIT", read from data.tfds_data_dir, the documents in
             feature data.tfds_text_key; t2mlr_jax.data.tfds_source)

With a byte-level text tokenizer (every task but S5-retrieval) the batches carry `target_bytes`, so
training and evaluation also report bits per byte ("bpb"); a text token store must match data.tokenizer.

Generation eval (eval.generate) scores greedy continuations of the eval prompts with the task's rule
from t2mlr_jax.data.answers. Everything here checks its inputs (paths, vocabulary) eagerly, so a bad
config fails before compilation. Training data read from files or TFDS must hold one batch:
train.batch_size examples, or train.batch_size x data.seq_len text tokens besides EOS and special tokens
(t2mlr_jax.data.pipeline, "Training data holds one batch").
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable, Iterator

import jax
import numpy as np

from t2mlr_jax.config.sections import Data, Experiment
from t2mlr_jax.data import answers, pipeline
from t2mlr_jax.data.batch import PROMPT, RECURRENT
from t2mlr_jax.data.char_tokenizer import S5CharTokenizer
from t2mlr_jax.data.sft import encode_prompt, gsm8k_aug_record, hotpotqa_record
from t2mlr_jax.data.tasks import GeneratedTaskSource
from t2mlr_jax.data.tfds_source import TfdsDocuments
from t2mlr_jax.data.tokenizer import load_tokenizer
from t2mlr_jax.parallel.multihost import all_hosts_rows
from t2mlr_jax.train.data_source import DataSource

# How a generated continuation is judged, per task / record format: (text, record) -> bool.
SCORERS: dict[str, Callable[[str, dict], bool]] = {
    "variable_assignment": lambda text, record: answers.exact_answer_correct(text, record["answer"]),
    "prompt_response": lambda text, record: answers.boxed_answer_correct(text, record["response"]),
    "prosqa": answers.prosqa_path_correct,
    "pathfinding": answers.pathfinding_path_correct,
    "gsm8k_aug": lambda text, record: answers.gsm_answer_correct(text, record["answer"]),
    "hotpotqa": lambda text, record: answers.exact_answer_correct(
        answers.extract_gsm_answer(text) or "", record["answer"]
    ),
}


PATH_FIELDS = {"train_path": "training data", "eval_path": "evaluation data", "tokenizer": "tokenizer"}


def _require_path(path: str, what: str, hint: str = "") -> str:
    """`path` of the data field `what` (a PATH_FIELDS key), which must exist; `hint` (data.hint: how to get
    this config's data) ends the error when the config left the path empty."""
    if not path:
        hint = f". {hint}" if hint else ""
        raise ValueError(f"data.{what} is empty: give the path of the {PATH_FIELDS[what]}{hint}")
    if not os.path.exists(path):
        raise FileNotFoundError(f"data.{what} {path!r} does not exist")
    if os.path.isfile(path) and os.path.getsize(path) == 0:
        raise ValueError(f"data.{what} {path!r} is an empty file")
    return path


def _require_paths(paths: str, what: str, hint: str = "") -> list[str]:
    """Text data: one path or a comma list of files / folders (e.g. a held-out split of one corpus)."""
    return [_require_path(p.strip(), what, hint) for p in (paths or "").split(",") if p.strip()] or [
        _require_path("", what, hint)
    ]


def build_data_source(config: Experiment, *, train: bool = True) -> DataSource:
    """The run's data; `train=False` (evaluation, generation) builds and checks only the eval side."""
    d, t, e = config.data, config.train, config.eval
    packings = pipeline.TEXT_PACKINGS if d.kind == "text" else pipeline.EXAMPLE_PACKINGS
    if d.packing not in packings:
        raise ValueError(
            f"data.packing must be one of {packings} for data.kind={d.kind!r}, got {d.packing!r}"
        )
    if (d.source or d.eval_source) and d.kind != "text":
        raise ValueError(f'data.source / data.eval_source are for data.kind="text", not {d.kind!r}')
    is_s5 = (
        d.kind == "generated" and d.task == "s5_retrieval" or d.kind == "file" and d.format == "s5_retrieval"
    )
    tokenizer = (
        S5CharTokenizer() if is_s5 else load_tokenizer(_require_path(d.tokenizer, "tokenizer", d.hint))
    )
    byte_lengths = pipeline.target_byte_lengths(None if is_s5 else tokenizer)
    if e.require_bpb and byte_lengths is None:
        raise ValueError(
            f"eval.require_bpb: the tokenizer ({d.tokenizer or 'S5 characters'}) is not a byte-level text "
            "tokenizer, so bits per byte are undefined"
        )
    vocab = config.model.vocab_size
    window = e.window or d.seq_len
    common = dict(vocab_size=vocab, worker_count=d.worker_count)
    encoding = dict(chat=d.chat, all_recurrent=d.all_recurrent, prompt_loss=d.prompt_loss)
    sft = dict(**encoding, packing=d.packing)
    train_pass = dict(batch_size=t.batch_size // jax.process_count(), seq_len=d.seq_len)  # this host's rows
    eval_pass = dict(batch_size=e.batch_size, seq_len=window, num_epochs=1, shuffle=False)
    options, eval_options = dict(d.options), {**d.options, **d.eval_options}
    records = None  # eval records for generation: () -> iterable of (record, prompt ids)
    train_examples = None  # counted for train.epochs

    if d.kind == "generated":
        task_tokenizer = None if is_s5 else tokenizer

        def batches(split, num_examples, task_options, **kw):
            return pipeline.task_batches(
                d.task,
                split,
                seed=config.seed if split == "train" else config.seed + 1,
                num_examples=num_examples,
                tokenizer=task_tokenizer,
                **common,
                **sft,
                **task_options,
                **kw,
            )

        train_batches = batches("train", d.train_examples, options, **train_pass) if train else None
        train_examples = d.train_examples
        evaluation = lambda: batches(d.eval_split, e.num_examples, eval_options, **eval_pass)
        source = GeneratedTaskSource(  # the eval pass's examples
            d.task, d.eval_split, seed=config.seed + 1, num_examples=e.num_examples, **eval_options
        )
        if is_s5:  # every row's length is known; generating 4800 of them to check would take seconds
            if source.config.max_tokens > window:
                raise ValueError(
                    f"S5-retrieval eval examples reach {source.config.max_tokens} tokens, "
                    + _longer_than_eval_row(window)
                )
        else:
            records = lambda: (source[i] for i in range(len(source)))
            encode = pipeline.record_encoder(source.spec.format, tokenizer, **encoding)
            _check_eval_rows(map(encode, records()), window, "")
        scorer = SCORERS.get(d.task)
    elif d.kind == "file":

        def batches(path, **kw):
            return pipeline.file_batches(
                path,
                format=d.format,
                tokenizer=None if is_s5 else tokenizer,
                seed=config.seed,
                **common,
                **sft,
                **kw,
            )

        train_batches = (
            batches(
                _require_path(d.train_path, "train_path", d.hint), **train_pass, min_examples=t.batch_size
            )
            if train
            else None
        )
        if train and t.epochs:
            train_examples = len(pipeline.load_records(d.train_path))
        eval_path = _require_path(d.eval_path, "eval_path", d.hint)
        evaluation = lambda: batches(eval_path, **eval_pass)
        encode = pipeline.record_encoder(d.format, None if is_s5 else tokenizer, **encoding)
        _check_eval_rows(map(encode, pipeline.load_records(eval_path)), window, f" of {eval_path}")
        if not is_s5:
            records = lambda: itertools.islice(_file_records(eval_path, d.format), e.num_examples)
        scorer = SCORERS.get(d.format)
    else:

        def text_input(source: str, path_field: str) -> dict:
            """A TFDS split when `source` is set, else the files of data.<path_field>."""
            if source:
                return dict(
                    documents=TfdsDocuments(source, data_dir=d.tfds_data_dir, text_key=d.tfds_text_key)
                )
            return dict(paths=_require_paths(getattr(d, path_field), path_field, d.hint))

        def batches(inputs, **kw):
            return pipeline.text_batches(
                **inputs, tokenizer=tokenizer, packing=d.packing, seed=config.seed, **common, **kw
            )

        train_batches = (
            batches(
                text_input(d.source, "train_path"),
                **train_pass,
                min_tokens=t.batch_size * d.seq_len,
                max_tokens=d.train_tokens,
            )
            if train
            else None
        )
        eval_text = batches(text_input(d.eval_source, "eval_path"), **eval_pass, min_tokens=1)
        evaluation = lambda: itertools.islice(iter(eval_text), max(1, e.num_examples // e.batch_size))
        scorer = _continues

    generation_examples = None
    if records is not None:
        generation_examples = lambda: (_prompt_example(r, tokenizer, d) for r in records())
    elif d.kind == "text":
        generation_examples = lambda: _text_prompts(evaluation(), window // 2, tokenizer.decode)
    return DataSource(
        vocab_size=tokenizer.vocab_size,
        seq_len=max(d.seq_len, window),
        train_iterator=lambda: iter(train_batches),
        eval_batches=lambda: all_hosts_rows(evaluation()),
        pad_id=tokenizer.pad_id if is_s5 else 0,
        eos_id=tokenizer.eos_id,
        generation_examples=generation_examples,
        decode=tokenizer.decode,
        score=scorer,
        train_examples=train_examples,
        target_bytes=byte_lengths is not None,
    )


def _check_eval_rows(examples: Iterable[dict], seq_len: int, where: str) -> None:
    """Every eval example fits an eval row: checked now, not when the first evaluation (perhaps hours into
    training) reaches the one that does not."""
    for i, example in enumerate(examples):
        if len(example["tokens"]) > seq_len:
            raise ValueError(
                f"eval example {i}{where} is {len(example['tokens'])} tokens, "
                + _longer_than_eval_row(seq_len)
            )


def _longer_than_eval_row(seq_len: int) -> str:
    return (
        f"longer than an eval row ({seq_len} tokens: eval.window, 0 = data.seq_len): raise "
        "eval.window (up to the model's context) or shorten the eval examples"
    )


def _text_prompts(batches, length: int, decode) -> Iterator[dict]:
    """Text generation: the first `length` tokens of each eval row's first document as the prompt, the
    rest of that document (within the row) as the reference continuation."""
    for batch in batches:
        for tokens, segments in zip(batch["tokens"], batch["segment_ids"]):
            ids = tokens[(segments == segments[0]) & (segments > 0)]
            if len(ids) > length:
                yield {"prompt": ids[:length], "reference": decode(ids[length:])}


def _continues(text: str, record: dict) -> bool:
    """A text continuation is right when it reproduces the held-out text as far as both go."""
    n = min(len(text), len(record["reference"]))
    return n > 0 and text[:n] == record["reference"][:n]


def _prompt_example(record: dict, tokenizer, d: Data) -> dict:
    """A record with its prompt ids and their control flow as in training: the first token 1, the rest 1
    (prompt, non-recurrent) or 2 (data.all_recurrent)."""
    prompt = encode_prompt(record["prompt"], tokenizer, chat=d.chat)
    control_flow = np.full(len(prompt), RECURRENT if d.all_recurrent else PROMPT, np.int32)
    control_flow[0] = PROMPT
    return {**record, "prompt": prompt, "prompt_control_flow": control_flow}


def _file_records(path: str, format: str):
    """Eval records with `prompt` / `response` / `answer`, converted as the pipeline converts them."""
    convert = {"gsm8k_aug": gsm8k_aug_record, "hotpotqa": hotpotqa_record}.get(format, lambda row: row)
    for row in pipeline.load_records(path):
        yield convert(row)
