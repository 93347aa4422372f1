"""PonderLM-2's release (LUMIA-Group/PonderLM-2), number for number: a tiny random model its own code built
(K = 2 thoughts), saved with its save_pretrained and ran (tests/interop/fixtures/ponderlm2_release/, made by
experiments/make_ponderlm2_fixture.py) imports as our arch ponderlm2 on a Llama backbone with the release's
settings; its training-forward logits, loss, every gradient, its evaluation forward and its cached decode
match; a perturbed weight, our own initialisation or unscaled embeddings each fail the check; an export
writes the release's folder back, bitwise."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2mlr_jax.architectures import build_architecture
from t2mlr_jax.architectures.lrt import Draw
from t2mlr_jax.architectures.ponderlm2 import (
    FIELDS,
    is_ponderlm2_release,
    load_ponderlm2_release,
    ponderlm2_settings,
    save_ponderlm2_release,
)
from t2mlr_jax.architectures.ponderlm2.evaluation import batch_of, ponderlm2
from t2mlr_jax.experiment import experiment, resolve
from t2mlr_jax.formats.files import read_json, read_state_dict
from t2mlr_jax.interop.pretrained import checkpoint_format, pretrained_config
from t2mlr_jax.studies.parity import relative_bound
from t2mlr_jax.studies.ponderlm2_parity import compare, our_outputs, path_layers
from t2mlr_jax.train import init_from
from tests.in_process import run_tool
from tests.interop.helpers import assert_planted_fails, check_figures
from tests.tolerance import assert_fp32_close, record

TOOL = Path(__file__).parents[2] / "tools" / "convert_checkpoint.py"

FIXTURE = Path(__file__).parent / "fixtures/ponderlm2_release"
LOAD = load_ponderlm2_release  # what the `imported` fixture (tests/interop/conftest.py) loads FIXTURE with
RELEASE = dict(np.load(FIXTURE / "release.npz"))
CONFIG = read_json(FIXTURE / "model/config.json")
PREFILL = 2  # the fixture's decode: a prefill of 2 tokens, then one per call
RELEASE_SETTINGS = {  # the release's scripts' flags as our ponderlm2 section, at the fixture's K = 2
    "thoughts": (2,),
    "embed_scale": True,
    "init": "growing",
    "passes": (3, 4),
    "pass_probs": (0.5, 0.5),
    "eval_passes": 4,
}


# Each output's path (ponderlm2_parity.path_layers), K = 2 thoughts on 2 layers: the training forward at
# the drawn R = 2 (K growing passes, R + 1 Jacobi passes) 5 x 2; the evaluation (K growing passes, 4)
# 6 x 2; the decode (a token's K + 1 slots in a chain) 3 x 2.
LAYERS = {"logits": 10, "train": 10, "eval": 12, "decode": 6}


def test_the_release_folder_reads_as_our_ponderlm2_settings(imported):
    assert checkpoint_format(FIXTURE / "model") == "ponderlm2" and is_ponderlm2_release(FIXTURE / "model")
    assert pretrained_config(FIXTURE / "model") == imported[0]  # what init_from checks, without the weights
    cfg, _, settings = imported
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_kv_heads, cfg.norm_eps) == (2, 32, 2, 0.1)
    assert settings == RELEASE_SETTINGS
    fixed = ponderlm2_settings({**CONFIG, "random_jacobi_iterations": False, "num_jacobi_iterations": 5})
    assert (fixed["passes"], fixed["pass_probs"], fixed["eval_passes"]) == ((6,), (1.0,), 6)
    bad = {**CONFIG, "interpolation": True, "recurrent_model": False, "num_latent_thoughts": 0}
    with pytest.raises(ValueError, match="cannot convert exactly") as refused:
        ponderlm2_settings(bad)
    for field in ("interpolation=true", "recurrent_model=false", "num_latent_thoughts=0"):
        assert field in str(refused.value)


@pytest.fixture(scope="module")
def ours(imported):
    cfg, params, settings = imported
    return our_outputs(cfg, params, settings, RELEASE["tokens"], int(RELEASE["jacobi"]), PREFILL)


@pytest.mark.slow
@pytest.mark.numerics
def test_every_output_matches_the_release(imported, ours):
    """Training forward (the release's R drawn under its seed), loss, all 21 gradients, its evaluation
    forward (R = 3) and its cached decode (our exact recurrence), each within its derived bound."""
    cfg, _, settings = imported
    assert int(RELEASE["jacobi"]) == 2 and path_layers(cfg, settings, "ponderlm2", 2) == LAYERS
    figures = compare(ours, RELEASE, LAYERS)
    check_figures(figures, "ponderlm2_release")
    assert figures["gradients"]["keys"] == 21 and not figures["gradients"]["zero_keys"]
    # the three are different functions: the release's decode is sequential, its evaluation Jacobi; their
    # gap is no round-off (1e-2, 1000x the decode's bound)
    assert figures["decode"]["release_decode_vs_forward"] > 1e-2


@pytest.mark.slow
@pytest.mark.numerics
@pytest.mark.parametrize("change", ["perturbed weight", "our initialisation", "unscaled embeddings"])
def test_each_part_of_the_mapping_is_what_matches(imported, change):
    """The check can fail: a weight moved by 1e-2, our vocabulary-only initialisation in place of the
    release's growing passes (K = 2: they differ), or embeddings without sqrt(2.5 H)."""
    cfg, params, settings = imported
    if change == "perturbed weight":
        layers = params["layers"]
        attn = {**layers["self_attn"], "k_proj": layers["self_attn"]["k_proj"].at[1].add(1e-2)}
        params = {**params, "layers": {**layers, "self_attn": attn}}
    elif change == "our initialisation":
        settings = {**settings, "init": "vocabulary"}
    else:
        settings = {**settings, "embed_scale": False}
    tokens = jnp.asarray(RELEASE["tokens"])
    b, t = tokens.shape
    arch = ponderlm2(cfg, settings, 3 * t)
    draw = Draw(2, int(RELEASE["jacobi"]) + 1)
    batch, state = batch_of(tokens, 3 * t), arch.init_model_state()
    train = jax.jit(lambda p: arch.apply(p, batch, training=True, rng=None, model_state=state, sample=draw))
    assert_planted_fails(train(params).logits, RELEASE["logits"], LAYERS["train"], 1e-4, change)


def test_an_export_writes_the_releases_folder_back(imported, tmp_path):
    cfg, params, settings = imported
    save_ponderlm2_release(cfg, params, settings, tmp_path / "back")
    theirs, back = read_state_dict(FIXTURE / "model"), read_state_dict(tmp_path / "back")
    assert sorted(back) == sorted(theirs) and all(np.array_equal(back[k], theirs[k]) for k in theirs)
    written = read_json(tmp_path / "back/config.json")
    assert {f: written[f] for f in FIELDS} == {f: CONFIG[f] for f in FIELDS}
    assert load_ponderlm2_release(tmp_path / "back")[2] == settings
    with pytest.raises(ValueError, match="init='vocabulary' .the release initialises by growing passes"):
        save_ponderlm2_release(cfg, params, {**settings, "init": "vocabulary"}, tmp_path / "never")
    assert not (tmp_path / "never").exists()


@pytest.mark.slow
@pytest.mark.numerics
def test_arch_ponderlm2_starts_from_the_release_folder():
    """What a researcher moving from the release runs: arch=ponderlm2 with the release's settings (read off
    its config.json) and config.init_from its folder, evaluated by the architecture's own apply: the
    release's evaluation logits."""
    cfg, _, settings = load_ponderlm2_release(FIXTURE / "model")
    t = RELEASE["tokens"].shape[1]
    config = experiment(
        name="from_release",
        model=cfg,
        arch="ponderlm2",
        data={"task": "s5_retrieval", "seq_len": 3 * t},
        evaluation={"window": t},
        sections={"ponderlm2": settings},
        init_from=str(FIXTURE / "model"),
    )
    typed = resolve(config)
    arch = build_architecture(typed)
    config.ponderlm2.embed_scale = False  # its weights without its embedding scale: refused
    unscaled = resolve(config)
    with pytest.raises(
        ValueError, match="release model with scale_embeds=True: set ponderlm2.embed_scale=True"
    ):
        init_from.start_weights(unscaled, build_architecture(unscaled))
    loaded = jax.tree.map(jnp.asarray, init_from.start_weights(typed, arch)())
    params = {**arch.init(jax.random.PRNGKey(0)), **loaded}
    batch, state = batch_of(jnp.asarray(RELEASE["tokens"]), t), arch.init_model_state()
    logits = jax.jit(lambda p: arch.apply(p, batch, training=False, rng=None, model_state=state).logits)(
        params
    )
    scale = np.abs(RELEASE["logits"]).max()
    assert_fp32_close(logits, RELEASE["eval_logits"], LAYERS["eval"], "arch ponderlm2's evaluation", scale)


@pytest.mark.slow
@pytest.mark.numerics
def test_convert_checkpoint_round_trips_the_release_folder_with_verify(tmp_path, capsys):
    """--from ponderlm2 --to orbax prints the settings of the release's model; --to ponderlm2 writes its
    folder back (at --thoughts 2, the scripts' recipe otherwise): the weights bitwise, its fields equal;
    --verify holds arch ponderlm2's evaluation against the PyTorch reference of the release's, both ways."""
    orbax, back = tmp_path / "orbax", tmp_path / "back"
    assert (
        run_tool(
            TOOL, "--from", "ponderlm2", "--to", "orbax", FIXTURE / "model", orbax, "--verify", "--seq-len", 8
        )
        == 0
    )
    assert '"init": "growing"' in capsys.readouterr().out
    assert (
        run_tool(
            TOOL,
            "--from",
            "orbax",
            "--to",
            "ponderlm2",
            orbax,
            back,
            "--thoughts",
            2,
            "--verify",
            "--seq-len",
            8,
        )
        == 0
    )
    for report in (tmp_path / "orbax.verify.json", tmp_path / "back.verify.json"):
        figures = read_json(report)  # ours against the torch reference's evaluation (its path: LAYERS)
        record(f"--verify {report.name}", figures["max_rel_logit_diff"], relative_bound(LAYERS["eval"]))
        assert figures["mode"] == "ponderlm2", figures
        assert figures["max_rel_logit_diff"] <= relative_bound(LAYERS["eval"]), figures
    theirs, written = read_state_dict(FIXTURE / "model"), read_state_dict(back)
    assert all(np.array_equal(written[k], theirs[k]) for k in theirs) and sorted(written) == sorted(theirs)
    assert {f: read_json(back / "config.json")[f] for f in FIELDS} == {f: CONFIG[f] for f in FIELDS}
    assert (
        run_tool(TOOL, "--from", "orbax", "--to", "ponderlm2", orbax, tmp_path / "k0", "--thoughts", 0) == 2
    )
