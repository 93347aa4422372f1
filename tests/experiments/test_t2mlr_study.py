"""experiments/t2mlr_study.py: --help and one-line errors; the text part's matching (every row on the same
unique text, the compute-matched transformer given T²MLR's training FLOPs) built from a BPE trained on one
play; and the table6 part end to end on a tiny S5 model (2 steps, three seeds): per-seed figures, the
claims' verdicts, the gate's trajectory, results.json / .md / .png, and a rerun that trains nothing."""

import json

import pytest

from configs.recipes import shakespeare_split
from experiments import analysis_common, t2mlr_study
from t2mlr_jax.analysis import protocol
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


def test_text_rows_share_their_unique_text_and_the_flop_row_gets_t2mlrs_budget(tmp_path, monkeypatch):
    from t2mlr_jax.architectures import build_architecture
    from t2mlr_jax.experiment import resolve
    from t2mlr_jax.train.trainer import flops_per_step, steps_for_budget, tokens_read

    train, heldout = (paths.split(",")[0] for paths in shakespeare_split())
    monkeypatch.setattr("configs.recipes.shakespeare_split", lambda: (train, heldout))  # one play each
    tokenizer = analysis_common.study_tokenizer(tmp_path, t2mlr_study.TEXT_VOCAB)
    assert json.loads((tmp_path / "tokenizer" / "tokenizer_summary.json").read_text())["vocab_size"] == 512
    monkeypatch.setattr(t2mlr_study, "study_tokenizer", lambda out, vocab: tokenizer)
    rows = list(t2mlr_study.PARTS["text"].rows)
    settings = t2mlr_study.text_settings(tmp_path, rows)
    typed = {row: resolve(t2mlr_study.row_config(row, 0, settings[row])) for row in rows}
    t2mlr = typed["text_t2mlr"]
    t2mlr_flops = t2mlr.train.steps * flops_per_step(t2mlr, build_architecture(t2mlr))
    unique = {row: settings[row]["data.train_tokens"] for row in rows}
    assert set(unique.values()) == {tokens_read(t2mlr, t2mlr.train.steps)["train_tokens_read"]}
    assert typed["text_transformer"].train.flop_budget == 0.0  # the same steps
    flops_row = typed["text_transformer_flops"]
    assert flops_row.train.flop_budget == pytest.approx(t2mlr_flops)
    per_step = flops_per_step(flops_row, build_architecture(flops_row))
    matched = steps_for_budget(flops_row, per_step, "transformer")
    assert matched.train.steps > t2mlr.train.steps  # the cheaper model trains longer, revisiting the text
    assert all(t.data.train_path.startswith(str(tmp_path / "data")) for t in typed.values())  # token stores
    assert all(t.eval.require_bpb and t.eval.bpb_masking == "nanochat" for t in typed.values())


@pytest.mark.slow  # six tiny S5 runs and three Jacobi evaluations
def test_table6_part_judges_its_claims_over_three_seeds(tmp_path, monkeypatch):
    monkeypatch.setattr(
        t2mlr_study,
        "ROWS",
        {name: row._replace(overrides={**row.overrides, **TINY}) for name, row in t2mlr_study.ROWS.items()},
    )
    argv = ["--parts=table6", f"--out={tmp_path}"]
    payload = t2mlr_study.main(argv)
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
