"""PonderLM-2's release's loop and pause baselines (--patch_method loop / pause), number for number: tiny
random models its own code built, saved and ran (tests/interop/fixtures/ponderlm2_release_loop/ and
_pause/, made by experiments/make_ponderlm2_fixture.py --size tiny_loop / tiny_pause) import as our arch
looped (the whole stack K + 1 = 4 times, looped.embed_scale) and arch pause (K = 3 pauses, the pause
embedding its row pause_token_id, pause.embed_scale); logits, loss, every gradient and the generation
match; a perturbed weight or unscaled embeddings fail; an export writes each folder back, bitwise."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2mlr_jax.architectures.ponderlm2 import FIELDS, load_ponderlm2_release, save_ponderlm2_release
from t2mlr_jax.architectures.ponderlm2.evaluation import batch_of, ponderlm2
from t2mlr_jax.formats.files import read_json, read_state_dict
from t2mlr_jax.studies.ponderlm2_parity import compare, loop_outputs, path_layers, pause_outputs
from tests.interop.helpers import assert_planted_fails, check_figures

FIXTURES = Path(__file__).parent / "fixtures"
PREFILL = 2
PAUSE_ID = (
    63  # the tiny pause fixture's pause_token_id (the release's default, 50288, is past its vocabulary)
)
ARCH = {"loop": "looped", "pause": "pause"}
LAYERS = {"loop": 4 * 2, "pause": 2}  # every output's path: the 2 layers 4 times (the loop), once (pause)
SETTINGS = {
    "loop": {"start": 0, "end": -1, "repeats": 4, "embed_scale": True},
    "pause": {"tokens": 3, "embed_scale": True},
}


def fixture(method: str) -> tuple[Path, dict]:
    folder = FIXTURES / f"ponderlm2_release_{method}"
    return folder, dict(np.load(folder / "release.npz"))


@pytest.fixture(scope="module", params=["loop", "pause"])
def imported(request):
    folder, release = fixture(request.param)
    return request.param, release, load_ponderlm2_release(folder / "model", method=request.param)


def test_the_folders_read_as_our_sections(imported):
    method, release, (cfg, params, settings) = imported
    assert str(release["method"]) == method and settings == SETTINGS[method]
    if method == "pause":
        np.testing.assert_array_equal(params["pause_embedding"], params["embed_tokens"][PAUSE_ID])


def outputs(method, cfg, params, settings, tokens):
    if method == "loop":
        return loop_outputs(cfg, params, settings, tokens, PREFILL)
    return pause_outputs(cfg, params, settings, tokens, PREFILL, PAUSE_ID)


@pytest.mark.slow
@pytest.mark.numerics
def test_every_output_matches_the_release(imported):
    """Logits, loss, every gradient, the evaluation and the decode, each within its derived bound."""
    method, release, (cfg, params, settings) = imported
    layers = path_layers(cfg, settings, method)
    assert set(layers.values()) == {LAYERS[method]}
    figures = compare(outputs(method, cfg, params, settings, release["tokens"]), release, layers)
    check_figures(figures, f"ponderlm2_release_{method}")
    assert figures["gradients"]["keys"] == 21 and not figures["gradients"]["zero_keys"]


@pytest.mark.slow
@pytest.mark.numerics
@pytest.mark.parametrize("change", ["perturbed weight", "unscaled embeddings"])
def test_each_part_of_the_mapping_is_what_matches(imported, change):
    method, release, (cfg, params, settings) = imported
    if change == "perturbed weight":
        layers = params["layers"]
        attn = {**layers["self_attn"], "k_proj": layers["self_attn"]["k_proj"].at[1].add(1e-2)}
        params = {**params, "layers": {**layers, "self_attn": attn}}
    else:
        settings = {**settings, "embed_scale": False}
    tokens = jnp.asarray(release["tokens"])
    arch = ponderlm2(cfg, settings, tokens.shape[1], arch=ARCH[method])
    batch, state = batch_of(tokens, tokens.shape[1]), arch.init_model_state()
    logits = jax.jit(lambda p: arch.apply(p, batch, training=True, rng=None, model_state=state).logits)(
        params
    )
    assert_planted_fails(logits, release["logits"], LAYERS[method], 1e-4, change)


def test_an_export_writes_the_folder_back(imported, tmp_path):
    method, _, (cfg, params, settings) = imported
    folder, _ = fixture(method)
    save_ponderlm2_release(cfg, params, settings, tmp_path / "back", method=method, pause_token_id=PAUSE_ID)
    theirs, back = read_state_dict(folder / "model"), read_state_dict(tmp_path / "back")
    assert sorted(back) == sorted(theirs) and all(np.array_equal(back[k], theirs[k]) for k in theirs)
    written, release = read_json(tmp_path / "back/config.json"), read_json(folder / "model/config.json")
    fields = (*FIELDS, "pause_token_id") if method == "pause" else FIELDS
    assert {f: written[f] for f in fields} == {f: release[f] for f in fields}
    with pytest.raises(ValueError, match="embed_scale=False"):
        save_ponderlm2_release(
            cfg, params, {**settings, "embed_scale": False}, tmp_path / "no", method=method
        )
