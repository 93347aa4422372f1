"""Zero-shot and few-shot benchmarks (ARC, HellaSwag, PIQA, ...) through lm-evaluation-harness.

`JaxLM` is lm-eval's model interface over one of our models. Log-likelihoods come from the
architecture's eval forward (`make_eval_step`: exact recurrence for T²MLR), each request scored as one
document, context + continuation, laid out as the text pipeline lays out a document (the first token a
prompt token, the rest recurrent) and scored on the continuation. Requests are sorted by length and
right-padded to power-of-two widths in batches of a fixed size, so a whole task compiles a few shapes.
An empty context (and so the first window of a rolling log-likelihood) is one token, `prefix_token_id`:
by default lm-eval's `hf` model's, the tokenizer's BOS, else its EOS. `generate_until` is the
architecture's cached greedy decoding (rows stop at EOS), cut at the first `until` string.
`run_tasks` runs `lm_eval.simple_evaluate` with it.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jaxtyping import Int
from lm_eval import simple_evaluate
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.tasks import TaskManager
from tqdm import tqdm

from t2mlr_jax.architectures import Architecture
from t2mlr_jax.architectures.t2mlr import backbone_architecture
from t2mlr_jax.data.batch import BATCH_DTYPES, PAD, PROMPT, RECURRENT
from t2mlr_jax.data.tokenizer import TextTokenizer, load_tokenizer
from t2mlr_jax.interop.pretrained import load_pretrained, pretrained_config, recorded_tokenizer
from t2mlr_jax.parallel.multihost import to_host
from t2mlr_jax.registry import did_you_mean
from t2mlr_jax.train.eval import left_pad, make_eval_step

MIN_WIDTH = 16  # the narrowest compiled row: short requests share one shape
DEFAULT_MAX_LENGTH = 2048  # the context of an architecture that states none
DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's default for generate_until tasks that set none


@dataclasses.dataclass(frozen=True)
class ModelBundle:
    """A model to evaluate: its architecture, weights, non-gradient state and text tokenizer."""

    arch: Architecture
    params: dict
    model_state: Any
    tokenizer: TextTokenizer


def checkpoint_tokenizer(checkpoint: str | Path, tokenizer: str | None = None) -> TextTokenizer:
    """The text tokenizer to evaluate `checkpoint` with (`tokenizer`, else the one the checkpoint records),
    once the checkpoint is known to be readable (its config and weight headers; the weights are not read).
    Every problem is one ValueError or FileNotFoundError line."""
    if not Path(checkpoint).exists():
        raise FileNotFoundError(f"checkpoint {checkpoint} does not exist")
    cfg = pretrained_config(checkpoint)
    source = tokenizer or recorded_tokenizer(checkpoint)
    if source is None:
        raise ValueError(
            f"{checkpoint} records no tokenizer: pass one (a .gguf, a tokenizer.json or its folder)"
        )
    text_tokenizer = load_tokenizer(str(source))
    if text_tokenizer.vocab_size > cfg.vocab_size:
        raise ValueError(
            f"the tokenizer {source} has {text_tokenizer.vocab_size} tokens, more than the vocabulary of "
            f"{checkpoint} ({cfg.vocab_size}): it is not this model's tokenizer"
        )
    return text_tokenizer


def load_bundle(checkpoint: str | Path, tokenizer: TextTokenizer) -> ModelBundle:
    """The model at `checkpoint` (a .gguf, an HF or T²MLR folder, an export, or a t2mlr / transformer
    training workdir or step), read by `load_pretrained` as config.init_from is, as the architecture that
    runs it: T²MLR with its release settings (exact evaluation, exact prefill) or the plain transformer."""
    cfg, params = load_pretrained(checkpoint)
    arch = backbone_architecture("t2mlr" if cfg.recurrence else "transformer", cfg, None)
    return ModelBundle(arch, params, arch.init_model_state(), tokenizer)


def empty_context_token(tokenizer: TextTokenizer, prefix_token_id: int | None = None) -> int:
    """The token an empty context is conditioned on: `prefix_token_id` if given, else, as lm-eval's `hf`
    model (HFLM.prefix_token_id), the tokenizer's BOS, else its EOS. One ValueError for an id outside
    the tokenizer's vocabulary."""
    if prefix_token_id is None:
        return tokenizer.eos_id if tokenizer.bos_id is None else tokenizer.bos_id
    if not 0 <= prefix_token_id < tokenizer.vocab_size:
        raise ValueError(
            f"prefix_token_id {prefix_token_id} is not a token of the tokenizer (ids 0 to "
            f"{tokenizer.vocab_size - 1})"
        )
    return prefix_token_id


def width_for(length: int, limit: int) -> int:
    """The compiled width of a row of `length` tokens: the next power of two (at least MIN_WIDTH),
    at most `limit`."""
    return min(max(MIN_WIDTH, 1 << (length - 1).bit_length()), limit)


def document_flow(length: int) -> Int[np.ndarray, " n"]:
    """The control flow of one document of `length` tokens: its first a prompt token, the rest recurrent."""
    flow = np.full(length, RECURRENT, np.int32)
    flow[:1] = PROMPT
    return flow


def scoring_batch(
    sequences: Sequence[Sequence[int]], scored: Sequence[int], width: int, batch_size: int
) -> dict[str, np.ndarray]:
    """Batch-contract arrays [batch_size, width] that score the last `scored[i]` tokens of `sequences[i]`
    given the tokens before them, one right-padded document per row. Rows past the sequences repeat the
    last one, so that every row the model sees is a real document."""
    sequences = list(sequences) + [sequences[-1]] * (batch_size - len(sequences))
    scored = list(scored) + [scored[-1]] * (batch_size - len(scored))
    batch = {key: np.zeros((batch_size, width), dtype) for key, dtype in BATCH_DTYPES.items()}
    for row, (ids, count) in enumerate(zip(sequences, scored)):
        n = len(ids) - 1  # inputs: every token but the last; targets: every token but the first
        batch["tokens"][row, :n] = ids[:-1]
        batch["targets"][row, :n] = ids[1:]
        batch["loss_mask"][row, n - count : n] = 1.0
        batch["positions"][row, :n] = np.arange(n)
        batch["segment_ids"][row, :n] = 1
        batch["control_flow"][row, :n] = document_flow(n)
    return batch


def cut_at_stops(text: str, until: Sequence[str]) -> str:
    """`text` up to the first occurrence of any `until` string (as lm-eval cuts generations)."""
    for stop in until:
        if stop:
            text = text.split(stop)[0]
    return text


class JaxLM(TemplateLM):
    """lm-eval's model interface over a ModelBundle: `batch_size` rows per compiled call, contexts of at
    most `max_length` tokens (default: the architecture's context) cut from the left, empty contexts
    conditioned on `empty_context_token(tokenizer, prefix_token_id)`, greedy generation."""

    def __init__(
        self,
        bundle: ModelBundle,
        *,
        batch_size: int = 8,
        max_length: int | None = None,
        max_gen_toks: int = DEFAULT_MAX_GEN_TOKS,
        prefix_token_id: int | None = None,
    ):
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self._prefix_token_id = empty_context_token(bundle.tokenizer, prefix_token_id)
        self.bundle = bundle
        self.params = jax.device_put(bundle.params)  # once, not with every call
        self.batch_size = batch_size
        self.max_length = max_length or bundle.arch.max_seq_len or DEFAULT_MAX_LENGTH
        self.max_gen_toks = max_gen_toks
        self._score = make_eval_step(bundle.arch)
        self._generate = jax.jit(bundle.arch.generate, static_argnums=(5, 6, 7))

    @property
    def eot_token_id(self) -> int:
        return self.bundle.tokenizer.eos_id

    @property
    def prefix_token_id(self) -> int:
        return self._prefix_token_id

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return self.bundle.tokenizer.encode(string).tolist()

    def tok_decode(self, ids) -> str:
        return self.bundle.tokenizer.decode(ids)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """(log-probability of the continuation, whether greedy decoding gives it) per
        ((context, continuation) strings, context ids, continuation ids) request."""
        sequences, scored = [], []
        for _, context, continuation in requests:
            if len(continuation) > self.max_length:
                raise ValueError(
                    f"a continuation of {len(continuation)} tokens is longer than the context of "
                    f"{self.max_length} tokens"
                )
            sequences.append((context + continuation)[-(self.max_length + 1) :])
            scored.append(len(continuation))
        order = sorted(range(len(sequences)), key=lambda i: -len(sequences[i]))  # longest first
        results: list[tuple[float, bool]] = [(0.0, False)] * len(sequences)
        with tqdm(total=len(order), desc="loglikelihood", disable=disable_tqdm) as progress:
            for start in range(0, len(order), self.batch_size):
                chunk = order[start : start + self.batch_size]
                width = width_for(len(sequences[chunk[0]]) - 1, self.max_length)
                batch = scoring_batch(
                    [sequences[i] for i in chunk], [scored[i] for i in chunk], width, self.batch_size
                )
                rows = to_host(self._score(self.params, self.bundle.model_state, batch))
                greedy = ((rows["predictions"] == batch["targets"]) | (batch["loss_mask"] == 0)).all(axis=1)
                for row, i in enumerate(chunk):
                    results[i] = (-float(rows["loss_sum"][row]), bool(greedy[row]))
                progress.update(len(chunk))
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """The log-probability of each whole text, in windows of the context that overlap by nothing
        (lm-eval's rolling windows: the first is conditioned on `prefix_token_id`)."""
        windows, owners = [], []
        for owner, (text,) in enumerate(request.args for request in requests):
            token_windows = lm_utils.get_rolling_token_windows(
                token_list=self.tok_encode(text),
                prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length,
                context_len=1,
            )
            for context, continuation in map(lm_utils.make_disjoint_window, token_windows):
                windows.append((None, context, continuation))
                owners.append(owner)
        totals = [0.0] * len(requests)
        for owner, (logprob, _) in zip(owners, self._loglikelihood_tokens(windows, disable_tqdm)):
            totals[owner] += logprob
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy continuations of each context, cut at the first of the request's `until` strings, of at
        most its `max_gen_toks` tokens; one compiled decode per (width, max_gen_toks)."""
        args = [request.args for request in requests]
        prompts = [self.tok_encode(context) or [self.prefix_token_id] for context, _ in args]
        settings = [self._generation_settings(options) for _, options in args]
        order = sorted(range(len(prompts)), key=lambda i: (settings[i][1], -len(prompts[i])))
        results = [""] * len(prompts)
        with tqdm(total=len(order), desc="generate_until", disable=disable_tqdm) as progress:
            for max_new, group in itertools.groupby(order, key=lambda i: settings[i][1]):
                room = self.max_length - max_new
                if room < 1:
                    raise ValueError(
                        f"max_gen_toks {max_new} leaves no room for a prompt in the context of "
                        f"{self.max_length} tokens"
                    )
                group = list(group)
                for start in range(0, len(group), self.batch_size):
                    chunk = group[start : start + self.batch_size]
                    texts = self._generate_rows([prompts[i][-room:] for i in chunk], max_new, room)
                    for i, text in zip(chunk, texts):
                        results[i] = cut_at_stops(text, settings[i][0])
                    progress.update(len(chunk))
        return results

    def _generate_rows(self, prompts: list[list[int]], max_new: int, room: int) -> list[str]:
        """Decoded greedy continuations of up to `batch_size` prompts, without their EOS."""
        rows = prompts + [prompts[-1]] * (self.batch_size - len(prompts))
        width = width_for(max(map(len, rows)), room)
        tokens, mask = left_pad([np.asarray(p, np.int32) for p in rows], PAD, width)
        control_flow = left_pad([document_flow(len(p)) for p in rows], PAD, width)[0]
        out = to_host(
            self._generate(
                self.params,
                self.bundle.model_state,
                tokens,
                mask,
                control_flow,
                max_new,
                self.eot_token_id,
                PAD,
            )
        )
        texts = []
        for row in range(len(prompts)):
            ids = out.tokens[row, : out.lengths[row]]
            texts.append(self.tok_decode(ids[:-1] if len(ids) and ids[-1] == self.eot_token_id else ids))
        return texts

    def _generation_settings(self, options: dict | None) -> tuple[list[str], int]:
        """(until strings, max_gen_toks) of a request's generation kwargs; sampling is refused (our
        architectures' generate is greedy)."""
        options = dict(options or {})
        if options.get("do_sample") or float(options.get("temperature") or 0.0) > 0.0:
            raise ValueError(
                f"generation settings {options} ask for sampling; this model decodes greedily only"
            )
        until = options.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        return until, int(options.get("max_gen_toks", self.max_gen_toks))


def task_manager(include_path: str | Path | None = None, *, builtin: bool = True) -> TaskManager:
    """lm-eval's task index: its own tasks (`builtin`; indexing them takes seconds) and those of the YAML
    files under `include_path`."""
    return TaskManager(
        include_path=None if include_path is None else str(include_path), include_defaults=builtin
    )


def tasks_manager(tasks: Sequence[str], include_path: str | Path | None = None) -> TaskManager:
    """The index that knows `tasks`: only the YAML files under `include_path` when they define them all
    (seconds saved), else lm-eval's own tasks too. Unknown names: one ValueError (check_tasks)."""
    if include_path is not None:
        local = task_manager(include_path, builtin=False)
        if all(name in local.all_tasks for name in tasks):
            return local
    manager = task_manager(include_path)
    check_tasks(tasks, manager)
    return manager


def check_tasks(tasks: Sequence[str], manager: TaskManager) -> None:
    """One ValueError naming the first of `tasks` that `manager` does not know (nor is a YAML file)."""
    if not tasks:
        raise ValueError("no tasks given")
    known = manager.all_tasks
    for name in tasks:
        if name not in known and not Path(name).is_file():
            raise ValueError(
                f"unknown task {name!r}{did_you_mean(name, known)}: name an lm-eval task or group, or "
                "one defined by a YAML file under include_path"
            )


def run_tasks(
    bundle: ModelBundle,
    tasks: Sequence[str],
    *,
    limit: int | None = None,
    num_fewshot: int | None = None,
    include_path: str | Path | None = None,
    batch_size: int = 8,
    manager: TaskManager | None = None,
    log_samples: bool = False,
    prefix_token_id: int | None = None,
) -> dict:
    """lm-eval's results dict for `tasks` on the bundle's model ("results": the metrics per task;
    "samples": every request and response, with `log_samples`). `manager` defaults to lm-eval's tasks
    plus those under `include_path`; `limit` caps the documents per task; `prefix_token_id` is what an
    empty context is conditioned on (default: the tokenizer's BOS, else its EOS, as lm-eval's `hf`)."""
    manager = manager or tasks_manager(tasks, include_path)
    check_tasks(tasks, manager)
    return simple_evaluate(
        model=JaxLM(bundle, batch_size=batch_size, prefix_token_id=prefix_token_id),
        tasks=list(tasks),
        num_fewshot=num_fewshot,
        limit=limit,
        task_manager=manager,
        log_samples=log_samples,
    )
