"""experiments/t2mlr_study.py: --help and one-line errors; the text part's design (fixed before it ran: 8
layers, the middle quarter, 256-token rows, 20 tokens per parameter, Jacobi D 16, the rule's recipe) and its
data built from a BPE trained on one play; the probe's seeds; and the table6 part end to end on a tiny S5
model (2 steps, three seeds): pre-registration, per-seed figures, the claims' verdicts, the gate's
trajectory, results.json / .md / .png, a rerun that trains nothing, the probe, and the refusal of a rerun
under another recipe."""

import json

import pytest

from configs.recipes import shakespeare_split
from t2mlr_jax.config.edit import config_module
from t2mlr_jax.studies import ROOT, analysis_common, protocol, t2mlr_study
from tests.experiments.test_jacobi_analyses import TINY as JACOBI_TINY

# test_jacobi_analyses' tiny S5 model and budget (rows of at most 9 tokens, 2 steps); D and B the study's
TINY = {k: v for k, v in JACOBI_TINY.items() if ".recurrence." not in k}


def test_help_and_bad_arguments(capsys):
    with pytest.raises(SystemExit) as exit_info:
        t2mlr_study.main(["--help"])
    assert exit_info.value.code == 0
    assert "--parts" in capsys.readouterr().out
    for argv, message in (
        (["--parts=s5,s6"], "unknown parts ['s6']"),
        (["--seeds=0,1", "--parts=s5"], "at least 3 distinct seeds"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            t2mlr_study.main(argv)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error:") and message in err and "\n" not in err


def test_the_text_part_is_the_design_fixed_before_it_ran(tmp_path, monkeypatch):
    from t2mlr_jax.architectures import build_architecture
    from t2mlr_jax.experiment import resolve

    design = config_module(ROOT / t2mlr_study.TEXT)
    train, heldout = (paths.split(",")[0] for paths in shakespeare_split())
    monkeypatch.setattr("configs.recipes.shakespeare_split", lambda: (train, heldout))  # one play each
    tokenizer = analysis_common.study_tokenizer(tmp_path, t2mlr_study.TEXT_VOCAB)
    assert json.loads((tmp_path / "tokenizer" / "tokenizer_summary.json").read_text())["vocab_size"] == 512
    monkeypatch.setattr(t2mlr_study, "study_tokenizer", lambda out, vocab: tokenizer)
    settings = t2mlr_study.text_settings(tmp_path)
    typed = {row: resolve(t2mlr_study.row_config(row, 0, settings)) for row in t2mlr_study.PARTS["text"].rows}
    t2mlr, transformer = typed["text_t2mlr"], typed["text_transformer"]
    params = {row: build_architecture(t).num_params() for row, t in typed.items()}
    assert params["text_t2mlr"] == design.T2MLR_PARAMS  # the steps are read off it
    assert 1.0 <= params["text_transformer"] / params["text_t2mlr"] < 1.05  # widened channel by channel
    rec = t2mlr.model.recurrence
    assert (t2mlr.model.num_layers, rec.l_start, rec.l_end) == (8, 3, 4)  # the middle quarter
    assert (t2mlr.t2mlr.forward_mode, rec.d_forward, rec.d_backward) == ("jacobi", 16, 4)
    assert t2mlr.data.seq_len == 256 and rec.gamma_recurrent_init == 0.1
    tokens = t2mlr.train.steps * t2mlr.train.batch_size * t2mlr.data.seq_len
    assert 20 <= tokens / params["text_t2mlr"] < 20.1
    for t in typed.values():  # the same data, steps and recipe for both rows
        assert (
            t.data.train_path.startswith(str(tmp_path / "data"))
            and t.data.train_path == t2mlr.data.train_path
        )
        assert t.eval.require_bpb and t.eval.bpb_masking == "nanochat" and t.eval.num_examples == 256
        assert t.train.steps == t2mlr.train.steps and t.optimizer == t2mlr.optimizer
    assert t2mlr.optimizer.lr_multiplier == design.SWEPT_LR_MULTIPLIER * 0.5 ** len(
        [m for m, bad in design.STABILITY_PROBES.items() if bad]
    )
    assert transformer.arch == "transformer" and t2mlr_study.TEXT_SEEDS == (0, 1, 2, 3, 4)
    probe = t2mlr_study.units_of(t2mlr_study.parse_args(["--probe", "--parts=text"]))
    assert probe == [(row, s) for row in ("text_t2mlr", "text_transformer") for s in (100, 101)]


@pytest.mark.slow  # six tiny S5 runs and three Jacobi evaluations
def test_table6_part_judges_its_claims_over_three_seeds(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(
        t2mlr_study,
        "ROWS",
        {name: row._replace(overrides={**row.overrides, **TINY}) for name, row in t2mlr_study.ROWS.items()},
    )
    argv = ["--parts=table6", f"--out={tmp_path}", "--workers=1"]
    payload = t2mlr_study.main(argv)
    registered = json.loads((tmp_path / "preregistration.json").read_text())
    assert set(registered["recipes"]) == {"s5_t2mlr", "s5_t2mlr_jacobi"} and len(registered["claims"]) == 2
    assert payload["meta"]["commit"] == registered["commit"]
    assert payload["meta"]["diverged"] == {"diverged": 0, "runs": [], "of": 6}
    table6 = payload["claims"]["table6"]
    assert set(table6["rows"]) == {"s5_t2mlr", "s5_t2mlr_jacobi", "s5_t2mlr_jacobi@jacobi"}
    assert all(row["n"] == 3 for row in table6["rows"].values())
    verdicts = {protocol.REPRODUCED, protocol.NOT_REPRODUCED, protocol.INCONCLUSIVE}
    assert [c["verdict"] in verdicts for c in table6["claims"]] == [True, True]
    jacobi = payload["rows"]["s5_t2mlr_jacobi"]
    assert sorted(jacobi) == [0, 1, 2] and all(len(r["gamma"]) == 2 for r in jacobi.values())
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["claims"]["table6"]["claims"][0]["margin"] == t2mlr_study.TABLE6_MARGIN
    markdown = (tmp_path / "results.md").read_text()
    assert "## Table 6" in markdown and "Seed-to-seed noise floor" in markdown and "tanh γ_rec" in markdown
    assert (tmp_path / "results.png").stat().st_size > 0
    lines = (tmp_path / "rows.jsonl").read_text().splitlines()
    assert len(lines) == 6
    again = t2mlr_study.main(argv)  # every run and evaluation read back: the same figures, nothing trained
    assert again["claims"] == payload["claims"]
    assert len((tmp_path / "rows.jsonl").read_text().splitlines()) == 6
    t2mlr_study.main([*argv, "--probe", "--seeds=0,1,2"])  # read back: only the divergence count written
    assert json.loads((tmp_path / "probe.json").read_text())["diverged"]["of"] == 6
    lr = t2mlr_study.ROWS["s5_t2mlr"].overrides | {"optimizer.lr_multiplier": 0.5}
    monkeypatch.setitem(t2mlr_study.ROWS, "s5_t2mlr", t2mlr_study.ROWS["s5_t2mlr"]._replace(overrides=lr))
    with pytest.raises(SystemExit) as exit_info:  # another recipe into the registered --out: refused
        t2mlr_study.main(argv)
    assert (
        exit_info.value.code == 2 and "pre-registered another recipe for s5_t2mlr" in capsys.readouterr().err
    )
