"""PonderLM-2's release's loop baseline (--patch_method loop), number for number: a tiny random model its
own code built (K = 3: the whole stack 4 times), saved and ran
(tests/interop/fixtures/ponderlm2_release_loop/, made by experiments/make_ponderlm2_fixture.py
--size tiny_loop) imports as our arch looped with
looped.embed_scale; its logits, loss, every gradient and its generation (our KV-cached LoopedDecoder) match;
a perturbed weight or unscaled embeddings fail; an export writes its folder back, bitwise."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2mlr_jax.interop.files import read_json, read_state_dict
from t2mlr_jax.interop.ponderlm2_parity import batch_of, compare, loop_outputs, ponderlm2
from t2mlr_jax.interop.ponderlm2_release import FIELDS, load_ponderlm2_release, save_ponderlm2_release

FIXTURE = Path(__file__).parent / "fixtures/ponderlm2_release_loop"
RELEASE = dict(np.load(FIXTURE / "release.npz"))
PREFILL = 2


@pytest.fixture(scope="module")
def imported():
    return load_ponderlm2_release(FIXTURE / "model", method="loop")


def test_the_folder_reads_as_our_looped_section(imported):
    assert str(RELEASE["method"]) == "loop"
    assert imported[2] == {"start": 0, "end": -1, "repeats": 4, "embed_scale": True}


@pytest.mark.slow
def test_every_output_matches_the_release(imported):
    cfg, params, settings = imported
    figures = compare(loop_outputs(cfg, params, settings, RELEASE["tokens"], PREFILL), RELEASE)
    assert figures["passed"], figures
    assert figures["gradients"]["keys"] == 21 and figures["gradients"]["max_relative_diff"] < 1e-5
    assert figures["logits"]["relative"] < 1e-6 and figures["decode"]["relative"] < 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("change", ["perturbed weight", "unscaled embeddings"])
def test_each_part_of_the_mapping_is_what_matches(imported, change):
    cfg, params, settings = imported
    if change == "perturbed weight":
        layers = params["layers"]
        attn = {**layers["self_attn"], "k_proj": layers["self_attn"]["k_proj"].at[1].add(1e-2)}
        params = {**params, "layers": {**layers, "self_attn": attn}}
    else:
        settings = {**settings, "embed_scale": False}
    tokens = jnp.asarray(RELEASE["tokens"])
    arch = ponderlm2(cfg, settings, tokens.shape[1], arch="looped")
    batch, state = batch_of(tokens, tokens.shape[1]), arch.init_model_state()
    logits = jax.jit(lambda p: arch.apply(p, batch, training=True, rng=None, model_state=state).logits)(
        params
    )
    assert np.abs(np.asarray(logits) - RELEASE["logits"]).max() > 1e-4


def test_an_export_writes_the_folder_back(imported, tmp_path):
    cfg, params, settings = imported
    save_ponderlm2_release(cfg, params, settings, tmp_path / "back", method="loop")
    theirs, back = read_state_dict(FIXTURE / "model"), read_state_dict(tmp_path / "back")
    assert sorted(back) == sorted(theirs) and all(np.array_equal(back[k], theirs[k]) for k in theirs)
    written, release = read_json(tmp_path / "back/config.json"), read_json(FIXTURE / "model/config.json")
    assert {f: written[f] for f in FIELDS} == {f: release[f] for f in FIELDS}
    with pytest.raises(ValueError, match="loop range .2, -1. .it loops the whole stack"):
        save_ponderlm2_release(cfg, params, {**settings, "start": 2}, tmp_path / "never", method="loop")
