"""The LRT release's vanilla GPT (a nanochat fork, OoDBag/Latent_recurrent_transformer), number for number: a
tiny random model its own code built, saved in its checkpoint format and ran
(tests/interop/fixtures/lrt_release_vanilla/, made by experiments/make_nanochat_fixture.py) imports as our
`nanochat()` backbone with its logits, loss, every gradient and its cached decode; the two settings it
needs that our other models do not (nanochat's RoPE orientation and its bfloat16 rotary tables) are each
shown to matter; a perturbed weight fails the check; and an export writes the release's format back.
Its recurrent (interleaved) GPT (tests/interop/fixtures/lrt_release_interleaved/) is our LRT: its
sequential inference our exact recurrence, its parallel interleaved training our lrt.training=interleaved."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from t2mlr_jax.architectures import build_architecture
from t2mlr_jax.architectures.lrt import forward as lrt_forward
from t2mlr_jax.experiment import experiment, resolve
from t2mlr_jax.formats.files import read_json
from t2mlr_jax.formats.nanochat import (
    from_nanochat_state,
    model_config_from_nanochat,
    nanochat_gpt_config,
    padded_vocab,
    to_nanochat_state,
)
from t2mlr_jax.interop import load_pretrained
from t2mlr_jax.interop.pretrained import checkpoint_format, pretrained_config
from t2mlr_jax.model import backbone
from t2mlr_jax.model.generate import teacher_forced
from t2mlr_jax.model.token_layout import make_layout
from t2mlr_jax.studies.parity import (
    compare_states,
    interleaved_forward,
    interleaved_training,
    path_layers,
)
from t2mlr_jax.train import init_from
from tests.interop.helpers import (
    assert_grads_parity,
    assert_loss_parity,
    assert_planted_fails,
    assert_release_decode,
    assert_release_gradients,
    exported_nanochat,
    nanochat_release,
    numpy_state,
)
from tests.tiny import score
from tests.tolerance import assert_fp32_close

FIXTURE = Path(__file__).parent / "fixtures/lrt_release_vanilla"
RELEASE, META, STATE, TOKENS = nanochat_release(FIXTURE)
PREFILL = 4  # the fixture's cached decode: 4 tokens at once, then one at a time
LAYERS = 4  # every output's path: the 4 layers (parity.path_layers), 10 blocks of the depth rule


def test_the_release_checkpoint_reads_as_our_nanochat_backbone():
    assert checkpoint_format(FIXTURE / "model") == "nanochat"
    cfg = pretrained_config(FIXTURE / "model")  # what init_from checks, without the weights
    gpt = META["model_config"]
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads) == (4, 64, 4, 2)
    assert (cfg.mlp, cfg.mlp_dim, cfg.sliding_window, cfg.value_embed_layers) == ("relu2", 256, 8, (1, 3))
    assert (cfg.rope_table_dtype, cfg.logit_softcap, cfg.norm_eps) == ("bfloat16", 15.0, 2.0**-23)
    assert nanochat_gpt_config(cfg) == {k: v for k, v in gpt.items() if k in nanochat_gpt_config(cfg)}
    with pytest.raises(ValueError, match="use_resid_lambdas and use_x0_residual differ"):
        model_config_from_nanochat({**gpt, "use_x0_residual": False})


@pytest.mark.numerics
def test_logits_match_the_release(imported):
    cfg, params = imported
    assert path_layers(cfg, params, TOKENS.shape[1])["logits"] == LAYERS
    assert_fp32_close(backbone.forward(cfg, params, TOKENS), RELEASE["logits"], LAYERS, "logits")


@pytest.mark.numerics
def test_loss_and_every_gradient_match_the_release(imported):
    # by the same map as the weights': the RoPE sign is linear
    assert_release_gradients(*imported, RELEASE, STATE, LAYERS)


@pytest.mark.numerics
def test_cached_decode_matches_the_releases(imported):
    assert_release_decode(*imported, RELEASE, PREFILL, LAYERS)


@pytest.mark.numerics
@pytest.mark.parametrize("change", ["perturbed weight", "rope unrotated", "float32 rope tables"])
def test_each_part_of_the_mapping_is_what_matches(imported, change):
    """The check can fail: a weight moved by 1e-2, the RoPE sign convention ignored, or float32 rotary
    tables each move the logits past 1e-4, far past their bound (1.2e-5 here)."""
    cfg, params = imported
    if change == "perturbed weight":
        state = dict(STATE)
        state["transformer.h.2.attn.c_k.weight"] = state["transformer.h.2.attn.c_k.weight"] + 1e-2
        params = from_nanochat_state(cfg, state)
    elif change == "rope unrotated":
        attn = params["layers"]["self_attn"]
        half = cfg.head_dim // 2
        flip = lambda w: w.at[..., half:].multiply(-1)
        params = {
            **params,
            "layers": {**params["layers"], "self_attn": {**attn, "q_proj": flip(attn["q_proj"])}},
        }
    else:
        cfg = cfg.replace(rope_table_dtype="float32")
    assert_planted_fails(backbone.forward(cfg, params, TOKENS), RELEASE["logits"], LAYERS, 1e-4, change)


def test_an_export_writes_the_releases_checkpoint_back(imported, tmp_path):
    cfg, params = imported
    written, meta = exported_nanochat(cfg, params, tmp_path / "back")
    same = compare_states(cfg.vocab_size, STATE, written)  # the vocabulary tables' real rows, bitwise
    assert same["bitwise"] and same["padded_rows_zero"], same
    assert same["padded_tables"] == [
        "lm_head.weight",
        "transformer.wte.weight",
        "value_embeds.1.weight",
        "value_embeds.3.weight",
    ]
    assert same["padded_rows"] == padded_vocab(cfg.vocab_size) - cfg.vocab_size == 28
    assert meta == {k: META["model_config"][k] for k in meta}
    assert model_config_from_nanochat(meta) == cfg


# The release's interleaved (recurrent) GPT: its true sequential inference (loss_eval's
# evaluate_bpb_sequential) is our LRT's exact recurrence (tests/interop/fixtures/lrt_release_interleaved/).
INTERLEAVED = Path(__file__).parent / "fixtures/lrt_release_interleaved"
SEQUENTIAL = dict(np.load(INTERLEAVED / "release.npz"))
PASSES = read_json(INTERLEAVED / "model/meta_000000.json")["model_config"]["interleaved_num_passes"]
# its paths (parity.path_layers): the sequential inference feeds each of the 12 tokens the previous one's
# final state, 12 x 4 layers; the training step, a full pass and PASSES passes, (1 + 2) x 4
SEQUENTIAL_LAYERS, TRAIN_LAYERS = 48, 12


@pytest.fixture(scope="module")
def interleaved():
    cfg, params = load_pretrained(INTERLEAVED / "model")
    return lrt_forward.LRTConfig(cfg), params


@pytest.mark.numerics
def test_the_interleaved_model_is_our_lrt_and_its_sequential_logits_match(interleaved):
    lrt, params = interleaved
    layers = path_layers(lrt.model, params, SEQUENTIAL["tokens"].shape[1], PASSES)
    assert (layers["logits"], layers["decode"], layers["train"]) == (SEQUENTIAL_LAYERS,) * 2 + (TRAIN_LAYERS,)
    assert lrt.model.value_embed_layers == (0, 1, 2, 3) and sorted(params["lrt"]) == [
        "gamma",
        "gate",
        "k_fb",
        "v_fb",
    ]
    tokens = jnp.asarray(SEQUENTIAL["tokens"])
    exact = lrt_forward.exact_forward(lrt, params, tokens, make_layout(tokens)).logits
    assert_fp32_close(exact, SEQUENTIAL["logits"], SEQUENTIAL_LAYERS, "sequential logits")
    decoded = teacher_forced(lrt_forward.LRTDecoder(lrt), (params, {}), tokens, PREFILL)
    assert_fp32_close(decoded, SEQUENTIAL["logits"], SEQUENTIAL_LAYERS, "cached decode")
    # the triple gate's split matters: swapping its local and feedback halves moves the logits
    gate = params["lrt"]["gate"]
    k = lrt.model.num_kv_heads
    swapped = {
        **params,
        "lrt": {**params["lrt"], "gate": jnp.concatenate([gate[..., k:], gate[..., :k]], -1)},
    }
    moved = lrt_forward.exact_forward(lrt, swapped, tokens, make_layout(tokens)).logits
    assert_planted_fails(moved, exact, SEQUENTIAL_LAYERS, 1e-3, "gate halves swapped")


def test_the_interleaved_model_exports_back_bitwise(interleaved, tmp_path):
    lrt, params = interleaved
    written, meta = exported_nanochat(lrt.model, params, tmp_path / "back")
    theirs = numpy_state(INTERLEAVED / "model/model_000000.pt")
    figures = compare_states(lrt.model.vocab_size, theirs, written)
    assert figures["bitwise"] and figures["padded_rows_zero"], figures
    release = read_json(INTERLEAVED / "model/meta_000000.json")["model_config"]
    assert meta["use_interleaved"] and meta == {k: release[k] for k in meta}


@pytest.mark.numerics
def test_arch_lrt_starts_from_the_releases_interleaved_checkpoint():
    """What a researcher moving from the release runs: arch=lrt with config.init_from its checkpoint (the
    model config read from it), evaluated by the architecture's own apply: the release's sequential logits."""
    model = pretrained_config(INTERLEAVED / "model")
    config = experiment(
        name="from_release",
        model=model,
        arch="lrt",
        data={"task": "s5_retrieval"},
        init_from=str(INTERLEAVED / "model"),
    )
    typed = resolve(config)
    arch = build_architecture(typed)
    loaded = jax.tree.map(jnp.asarray, init_from.start_weights(typed, arch)())  # host arrays, placed
    params = {**arch.init(jax.random.PRNGKey(0)), **loaded}
    logits = score(arch, params, jnp.asarray(SEQUENTIAL["tokens"]))
    assert_fp32_close(logits, SEQUENTIAL["logits"], SEQUENTIAL_LAYERS, "arch lrt's evaluation")


@pytest.mark.slow
@pytest.mark.numerics
def test_interleaved_training_matches_the_releases_training_step(interleaved):
    """Our lrt.training="interleaved" against the release's forward_interleaved_train (a full pass, then
    its interleaved_num_passes passes) on the fixture's tokens: every pass's logits, the loss (and each
    pass's mean cross-entropy within it) and every gradient, by the release's keys; with the KV refresh
    (lrt.interleaved_kv_refresh, the release's interleaved_kv_refresh) every pass's logits and the loss."""
    lrt, params = interleaved
    tokens = jnp.asarray(SEQUENTIAL["tokens"])
    refresh_loss, refresh_logits = interleaved_forward(lrt, params, tokens, PASSES, True)
    for p, ours in enumerate(refresh_logits):
        assert_fp32_close(ours, SEQUENTIAL[f"refresh_logits:{p}"], TRAIN_LAYERS, f"refresh pass {p}")
    passes = [SEQUENTIAL[f"train_logits:{p}"] for p in range(1 + PASSES)]
    deepest = max(np.abs(pass_logits).max() for pass_logits in passes)  # the loss's logits' scale
    refresh = max(np.abs(SEQUENTIAL[f"refresh_logits:{p}"]).max() for p in range(1 + PASSES))
    assert_loss_parity(refresh_loss, SEQUENTIAL["refresh_loss"], refresh, TRAIN_LAYERS, "refresh loss")
    (loss, logits), grads = interleaved_training(lrt, params, tokens, PASSES, False)
    assert len(logits) == len(SEQUENTIAL["pass_losses"]) == 1 + PASSES == 3
    targets = [tokens[:, 1:]] + [tokens[:, 1 + i :: PASSES] for i in range(PASSES)]
    for p, (ours, target) in enumerate(zip(logits, targets, strict=True)):
        assert_fp32_close(ours, passes[p], TRAIN_LAYERS, f"training pass {p}")
        ce = optax.softmax_cross_entropy_with_integer_labels(ours, target).mean()
        assert_loss_parity(ce, SEQUENTIAL["pass_losses"][p], passes[p], TRAIN_LAYERS, f"pass {p} loss")
    assert_loss_parity(loss, SEQUENTIAL["loss"], deepest, TRAIN_LAYERS)
    ours = to_nanochat_state(lrt.model, grads)
    theirs = {key.split(":", 1)[1]: value for key, value in SEQUENTIAL.items() if key.startswith("grad:")}
    assert_grads_parity(ours, theirs, TRAIN_LAYERS)


@pytest.mark.numerics
def test_a_perturbed_feedback_weight_fails_the_training_check(interleaved):
    """The check can fail: one feedback key projection moved by 1e-2 moves the interleaved passes' logits
    (pass 0's feedback is zero: it stays) and the gradients far past their bounds."""
    lrt, params = interleaved
    state = numpy_state(INTERLEAVED / "model/model_000000.pt")
    key = "interleaved_key_projections.1.W_v.weight"
    params = from_nanochat_state(lrt.model, {**state, key: state[key] + 1e-2}, interleaved=True)
    (_, logits), grads = interleaved_training(lrt, params, jnp.asarray(SEQUENTIAL["tokens"]), PASSES, False)
    assert_fp32_close(logits[0], SEQUENTIAL["train_logits:0"], TRAIN_LAYERS, "unmoved pass 0")
    assert_planted_fails(logits[1], SEQUENTIAL["train_logits:1"], TRAIN_LAYERS, 1e-3, "moved pass 1")
    moved = to_nanochat_state(lrt.model, grads)["transformer.h.0.attn.c_q.weight"]
    theirs = SEQUENTIAL["grad:transformer.h.0.attn.c_q.weight"]
    scale = np.abs(theirs).max()  # margin: 1e-4 of it; relative_bound(2L + 1) is gradient_bound(L)
    assert_planted_fails(moved, theirs, 2 * TRAIN_LAYERS + 1, 1e-4 * scale, "moved gradient", scale)
