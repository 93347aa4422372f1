"""experiments/lr_sweep.py: its flags, one-line errors before anything is built, the table it writes."""

import pytest

from t2mlr_jax.studies import lr_sweep


def test_help_lists_the_flags(capsys):
    with pytest.raises(SystemExit) as exit_info:
        lr_sweep.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--config", "--set", "--multipliers", "--seeds", "--metric", "--study_vocab", "--workers"):
        assert flag in out


@pytest.mark.parametrize(
    "flag, message",
    [
        ("--multipliers=1,-2", "--multipliers needs distinct values > 0"),
        ("--metric=speed", "--metric must be one of"),
        ("--set=optimizer.lr", "--set takes <dotted.path>=<value>"),
        ("--set=optimizer.no_such=1", "optimizer.no_such is not a config field"),
    ],
)
def test_bad_arguments_are_one_line_before_anything_trains(tmp_path, capsys, flag, message):
    argv = [
        "--config=configs/s5_retrieval_t2mlr.py:demo",
        "--set=arch=transformer",
        f"--out={tmp_path / 'o'}",
    ]
    with pytest.raises(SystemExit) as exit_info:
        lr_sweep.main([*argv, flag])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not any((tmp_path / "o").glob("x*"))  # no cell started


def test_the_table_marks_the_choice_and_the_diverged_runs():
    cells = {
        0.5: {100: {"metric": 0.30, "diverged": False}, 101: {"metric": 0.32, "diverged": False}},
        1.0: {100: {"metric": 0.25, "diverged": False}, 101: {"metric": 0.27, "diverged": False}},
        2.0: {100: {"metric": 0.20, "diverged": True}, 101: {"metric": 0.22, "diverged": False}},
    }
    meta = {"command": "c", "config": "f.py:p", "set": {}, "base_rates": {"lr": 3e-3}, "seeds": [100, 101],
            "metric": "loss", "lower_is_better": True, "commit": "abc",
            "diverged": {"diverged": 1, "runs": ["x2/seed100"], "of": 6}}  # fmt: skip
    text = lr_sweep.render(meta, cells, {0.5: 0.31, 1.0: 0.26, 2.0: 0.21}, 1.0)
    assert "| ×1 | 0.2500 | 0.2700 | 0.2600 | **chosen** |" in text
    assert "| ×2 | 0.2000 (diverged) | 0.2200 | 0.2100 |  |" in text
    assert "Diverged runs (loss > ln V after step 10): 1 of 6." in text
