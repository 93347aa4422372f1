"""experiments/recirculation.py and the sweep behind it, on a tiny random 3-layer model saved as a checkpoint
(the SmolLM2 vocabulary, so that the shipped tokenizer and Shakespeare windows serve): --help, main.py's
--mode=train handing the config to the sweep, one run of 2 pairs x 1 alpha writing every file with finite
changes, the plain model's perplexity (at temperatures 1 and 1.2) as its baseline, the temperature
control, the gain by position and the parallel-vs-serial speed-up, a rerun that scores nothing, and one
clear error per bad setting before anything is read or compiled."""

import json
import math
import subprocess
import sys

import jax
import numpy as np
import optax
import pytest

from configs.recipes import backbone_preset
from t2mlr_jax.config.edit import config_module, set_path
from t2mlr_jax.experiment import resolve
from t2mlr_jax.interop import load_pretrained, save_params
from t2mlr_jax.model import backbone
from t2mlr_jax.model.config import ModelConfig
from t2mlr_jax.model.params import init_params
from t2mlr_jax.studies import recirculation_scoring as scoring
from t2mlr_jax.studies import recirculation_sweep as sweep
from t2mlr_jax.studies.training_free import STUDIES
from tests.experiments import ROOT
from tests.test_eval_pretrained import run_main

TINY = ModelConfig(
    vocab_size=49152,
    hidden_size=32,
    num_layers=3,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    mlp_dim=64,
    max_seq_len=64,
)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("recirculation") / "tiny"
    save_params(path, TINY, jax.device_get(init_params(TINY, jax.random.PRNGKey(0))))
    return path


def _config(checkpoint, **changes):
    """The cpu preset on the tiny model: windows of 32 tokens (2 batches of 2), alpha 0.5, pairs (1, 0) and
    (2, 1), the looping control and one serial check; typed, as main.py hands it over."""
    config = config_module(ROOT / "configs" / "recirculation.py").get_config("cpu")
    fields = {
        **backbone_preset(TINY),
        "init_from": str(checkpoint),
        "data.seq_len": 32,
        "eval.window": 32,
        "eval.batch_size": 2,
        "eval.num_examples": 4,
        "recirculation.source": 2,
        "recirculation.destination": 1,
        "recirculation.sweep_alphas": "0.5",
        "recirculation.sweep_stride": 1,
        "recirculation.sweep_max_gap": 1,
        **changes,
    }
    for path, value in fields.items():
        set_path(config, path, value)
    return resolve(config)


def _same_cell(a: dict, b: dict) -> bool:
    return all(a[k] == b[k] for k in ("source", "destination", "scheme", "alpha"))


def _refuse(*args, **kwargs):
    raise AssertionError("a cell was scored")


@pytest.mark.slow
def test_help_lists_the_flags():
    out = subprocess.run(
        [sys.executable, "-m", "experiments.recirculation", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "--config" in out.stdout and "--workdir" in out.stdout and "heatmap_looping.png" in out.stdout


def test_main_train_mode_hands_recirculation_to_the_sweep(tmp_path, monkeypatch, capsys):
    """arch recirculation has nothing to train: main.py's --mode=train runs the sweep with the config
    as given (overrides included) and the workdir, and nothing else; an architecture that trains is not
    handed over."""
    import main as framework

    calls = []

    def fake(config, workdir):
        calls.append((config, workdir))

    monkeypatch.setattr(sweep, "run_sweep", fake)  # what the registered study runs, imported when it runs
    workdir = tmp_path / "sweep"
    config_file = f"--config={ROOT / 'configs' / 'recirculation.py'}:cpu"
    run_main(
        config_file, f"--workdir={workdir}", "--config.recirculation.sweep_stride=3", monkeypatch=monkeypatch
    )
    ((config, given),) = calls
    assert (config.arch, config.recirculation.sweep_stride, config.eval.window) == ("recirculation", 3, 256)
    assert given == workdir and not workdir.exists()
    assert f"recirculation has nothing to train: running its sweep into {workdir}" in capsys.readouterr().out
    assert framework._training_free(config) is STUDIES.get("recirculation")
    adaptive = config.replace(arch="recirculation_adaptive")  # trains its MLP with the trainer
    assert framework._training_free(adaptive) is None


def test_a_parallel_evaluation_stopped_at_its_cap_still_moving_is_marked_unconverged():
    from t2mlr_jax.studies.recirculation_scoring import Cell, record

    raw = dict(nll=[10.0], tokens=8.0, bytes=0.0, nll_by_position=[], seconds=1.0)
    cell = Cell("recirculation", 2, 1, "ratio", 0.5)
    capped = record(cell, {**raw, "passes": [16, 16], "changes": [1e-6, 0.03]}, None, tol=1e-4)
    assert capped["converged"] is False and capped["final_change"] == 0.03 and capped["passes"]["max"] == 16
    settled = record(cell, {**raw, "passes": [5, 7], "changes": [1e-6, 5e-5]}, None, tol=1e-4)
    assert settled["converged"] is True
    unmeasured = record(cell, {**raw, "passes": [16], "changes": [float("nan")]}, None, tol=1e-4)
    assert unmeasured["converged"] is None and unmeasured["final_change"] is None
    serial = record(cell, {**raw, "passes": [0], "changes": [0.0]}, None, tol=1e-4)
    assert "converged" not in serial and "passes" not in serial


@pytest.mark.slow
def test_sweep_writes_every_file_and_a_rerun_scores_nothing(tmp_path, checkpoint, monkeypatch):
    config, workdir = _config(checkpoint), tmp_path / "sweep"
    results = sweep.run_sweep(config, workdir)
    lines = [json.loads(line) for line in (workdir / sweep.CELLS).read_text().splitlines()]
    assert [(r["kind"], r["source"], r["destination"]) for r in lines] == [
        ("baseline", -1, -1),
        ("recirculation", 1, 0),
        ("recirculation", 2, 1),
        ("looping", 1, 0),
        ("looping", 2, 1),
        ("check", results["best"]["source"], results["best"]["destination"]),
    ]
    assert all(math.isfinite(r["change_pct"]) for r in lines[1:5])
    assert any(r["change_pct"] != 0 for r in lines[1:5])  # recirculation and looping act
    check = results["serial_check"][0]
    # Not round-off: the parallel passes stop once no source state moves by more than parallel_tol (1e-4,
    # relative), so the perplexity is the serial one to that tolerance, not to fp32's.
    assert check["perplexity_rel_diff"] < config.recirculation.parallel_tol
    assert check["parallel"]["passes"]["max"] <= 16
    parallel, serial = check["parallel"], check["serial"]  # timed side by side, compilation apart
    assert parallel["converged"] and parallel["final_change"] <= config.recirculation.parallel_tol
    assert min(parallel["seconds"], serial["seconds"], parallel["compile_seconds"]) > 0
    assert check["speedup"] == pytest.approx(serial["seconds"] / parallel["seconds"])
    for name in ("results.json", "heatmap_ratio_alpha0.5.png", "heatmap_looping.png", "gain_by_position.png"):
        assert (workdir / name).stat().st_size > 0
    assert json.loads((workdir / sweep.RESULTS).read_text())["best"] == results["best"]

    # The best cell is chosen on the selection windows and reported on the other windows.
    chosen, report = results["selection"], results["best"]["report"]
    assert sorted(chosen["selection_windows"] + chosen["report_windows"]) == [0, 1, 2, 3]
    assert len(chosen["selection_windows"]) == 2 and report["windows"] == 2
    assert sum(lines[0]["nll_by_window"]) == pytest.approx(lines[0]["nll"][0])
    gained = lambda line, windows: sum(
        line["nll_by_window"][i] - lines[0]["nll_by_window"][i] for i in windows
    )
    cells = [r for r in lines if r["kind"] == "recirculation"]
    assert _same_cell(min(cells, key=lambda r: gained(r, chosen["selection_windows"])), results["best"])
    report_tokens = sum(lines[0]["tokens_by_window"][i] for i in chosen["report_windows"])
    best_line = next(r for r in cells if _same_cell(r, results["best"]))
    assert report["change_pct"] == pytest.approx(
        100 * (math.exp(gained(best_line, chosen["report_windows"]) / report_tokens) - 1)
    )
    assert report["interval"]["n"] == 2 and report["interval"]["low"] < report["interval"]["high"]
    assert len(report["per_window_pct"]) == 2
    assert results["best_by_scheme"] == {"ratio": results["best"]}  # one scheme: its best is the best

    # The baseline is the plain model's perplexity over the same windows, at temperatures 1 and 1.2.
    _, params = load_pretrained(checkpoint)
    nll, tokens = np.zeros(2), 0.0
    plain = jax.jit(backbone.forward, static_argnums=0)
    batches = scoring.windows(config)
    for batch in batches:
        layout = dict(positions=batch["positions"], segment_ids=batch["segment_ids"])
        logits = plain(TINY, params, batch["tokens"], **layout)
        mask = batch["loss_mask"]
        for i, temperature in enumerate((1.0, 1.2)):
            token_nll = optax.softmax_cross_entropy_with_integer_labels(
                logits / temperature, batch["targets"]
            )
            nll[i] += float((token_nll * mask).sum())
        tokens += float(mask.sum())
    base, base_hot = np.exp(nll / tokens)
    np.testing.assert_allclose(results["baseline"]["perplexity"], base, rtol=1e-5)
    np.testing.assert_allclose(lines[0]["control_temperature"]["perplexity"], base_hot, rtol=1e-5)

    # The temperature control: the base model at 1.2 alone, the best cell alone, both together.
    control, best = results["controls"]["temperature"], results["best"]
    assert control["temperature"] == 1.2
    hot = lines[0]["control_temperature"]["perplexity"] / results["baseline"]["perplexity"]
    assert control["baseline_change_pct"] == pytest.approx(100 * (hot - 1))
    assert control["best_change_pct"] == best["change_pct"]
    assert control["combined_change_pct"] == best["control_temperature"]["change_pct"]
    assert control["sum_of_separate_pct"] == pytest.approx(
        control["baseline_change_pct"] + best["change_pct"]
    )
    assert control["non_additivity_pct"] == pytest.approx(
        control["combined_change_pct"] - control["sum_of_separate_pct"]
    )
    assert all(math.isfinite(v) for v in control.values()) and control["baseline_change_pct"] != 0

    # Gain by position: the best cell's NLL against the baseline's per bucket of the 32-token windows.
    gain, counts = results["gain_by_position"], scoring.position_counts(batches, 32)
    assert gain["bucket_start"] == list(range(0, 32, 32 // scoring.POSITION_BUCKETS))  # every bucket seen
    assert gain["tokens"] == counts.tolist() and sum(gain["tokens"]) == tokens
    best_line = next(r for r in lines if r["kind"] == "recirculation" and _same_cell(r, best))
    expected = (np.subtract(lines[0]["nll_by_position"], best_line["nll_by_position"])) / counts
    np.testing.assert_allclose(gain["nll_gain"], expected, rtol=1e-6)
    np.testing.assert_allclose(gain["change_pct"], 100 * (np.exp(-expected) - 1), rtol=1e-6)
    assert np.all(np.isfinite(gain["nll_gain"])) and np.any(np.asarray(gain["nll_gain"]) != 0)

    monkeypatch.setattr(scoring, "_token_nll", _refuse)
    again = sweep.run_sweep(config, workdir)
    assert again["grid"] == results["grid"] and again["timings"]["evaluated_now"] == 0
    assert len((workdir / sweep.CELLS).read_text().splitlines()) == len(lines)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"recirculation.source": 1}, "must be deeper"),
        ({"recirculation.source": 3}, "blocks 0..2"),
        ({"recirculation.sweep_alphas": "0.5,1.5"}, r"\(0, 1\]"),
        ({"recirculation.sweep_schemes": "ratio,ratios"}, "scheme must be one of"),
        ({"eval.window": 128}, "eval.window 128 is longer than the model's context"),
        ({"recirculation.sweep_selection_fraction": 1.0}, r"sweep_selection_fraction must be in \(0, 1\)"),
    ],
)
def test_bad_settings_fail_before_anything_runs(tmp_path, checkpoint, monkeypatch, changes, message):
    monkeypatch.setattr(scoring, "_token_nll", _refuse)
    monkeypatch.setattr(scoring, "build_data_source", _refuse)
    with pytest.raises(ValueError, match=message):
        sweep.run_sweep(_config(checkpoint, **changes), tmp_path / "sweep")
    assert not (tmp_path / "sweep").exists()


@pytest.mark.slow  # two small sweeps: 2 schemes x 2 pairs, then the ramped ratio scheme's 2 pairs
def test_the_study_chooses_per_scheme_and_reports_on_the_other_split(tmp_path, checkpoint, monkeypatch):
    from t2mlr_jax.studies import recirculation_study as study

    small = {"recirculation.sweep_controls": False, "recirculation.sweep_serial_check": 0}
    configs = {
        "study": _config(checkpoint, **small, **{"recirculation.sweep_schemes": "ratio,renorm"}),
        "study,ramp": _config(checkpoint, **small, **{"recirculation.ramp": True}),
    }
    monkeypatch.setattr(study, "sweep_config", configs.__getitem__)
    payload = study.main([f"--out={tmp_path}"])
    rows = {r["row"]: r for r in payload["rows"]}
    assert list(rows) == ["ratio", "renorm", "ratio + ramp"]
    for name, row in rows.items():
        chosen = json.loads(
            (tmp_path / ("ramp" if "ramp" in name else "schemes") / sweep.RESULTS).read_text()
        )
        scheme = chosen["best_by_scheme"][row["cell"]["scheme"]]
        assert row["report_change_pct"] == scheme["report"]["change_pct"]  # reported on the other windows
        assert row["interval"]["n"] == 2 and row["verdict"] in {
            "reproduced at this scale",
            "not reproduced",
            "inconclusive",
        }
    ratio, ramped = (
        json.loads((tmp_path / folder / sweep.RESULTS).read_text())["best_by_scheme"]["ratio"]["report"]
        for folder in ("schemes", "ramp")
    )
    paired = [a - b for a, b in zip(ramped["per_window_pct"], ratio["per_window_pct"])]
    assert payload["ramp"]["difference"]["mean"] == pytest.approx(sum(paired) / 2)
    assert "| renorm |" in (tmp_path / "results.md").read_text()
    assert (tmp_path / "results.png").stat().st_size > 0
    # pre-registered before anything ran: both sweeps' settings, the claims, the commit results.json carries
    registered = json.loads((tmp_path / "preregistration.json").read_text())
    assert (
        set(registered["recipes"]) == {"schemes", "ramp"}
        and registered["commit"] == payload["meta"]["commit"]
    )
    assert [(c["row"], c["baseline"]) for c in registered["claims"]][-2:] == [
        ("renorm", "baseline"),
        ("ratio + ramp", "ratio"),
    ]
    # another grid into the same --out is refused in one line, before anything is scored
    configs["study"] = _config(checkpoint, **small, **{"recirculation.sweep_schemes": "ratio"})
    before = (tmp_path / "results.json").read_text()
    with pytest.raises(SystemExit) as refused:
        study.main([f"--out={tmp_path}"])
    assert refused.value.code == 2 and (tmp_path / "results.json").read_text() == before
    # a chosen cell whose parallel evaluation stopped at its cap still moving is marked, not judged
    chosen = json.loads((tmp_path / "schemes" / sweep.RESULTS).read_text())["best_by_scheme"]["ratio"]
    unconverged = study.judged({**chosen, "converged": False, "final_change": 0.03}, "ratio")
    assert unconverged["verdict"] == "unconverged (final change 0.03)"
