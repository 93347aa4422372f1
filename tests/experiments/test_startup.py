"""experiments/startup.py: bad arguments are one `error:` line (exit 2) with nothing written; the tables'
medians and per-repetition ratios; one real run of the T²MLR :cpu preset, stopped at its first step, whose
time the phases it wrote add up to."""

import pytest

from t2mlr_jax.studies.benchmarks import startup


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--presets=t2mlr,nope"], "--presets: unknown ['nope']"),
        (["--reps=0"], "--reps must be >= 1"),
        (["--baseline_src=/nonexistent"], "is not a checkout of this repo"),
    ],
)
def test_bad_arguments_fail_in_one_line(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        startup.main([*argv, f"--out={tmp_path / 'out'}"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and err.startswith("error: ") and message in err and "\n" not in err
    assert not (tmp_path / "out").exists()


def test_medians_and_per_repetition_ratios():
    def run(code, kind, rep, seconds, **extra):
        metric = startup.METRIC[kind]
        return {"preset": "t2mlr", "code": code, "cache": kind, "rep": rep, metric: seconds, **extra}

    phases = {"imports": 1.0, "compile": 5.0}
    runs = [
        run("ours", "cold", 0, 10.0, phases=phases),
        run("ours", "cold", 1, 20.0, phases=phases),
        run("ours", "cold", 2, 12.0, phases=phases),
        run("baseline", "cold", 0, 60.0),
        run("baseline", "cold", 1, 60.0),
        run("baseline", "cold", 2, 72.0),
        run("ours", "steady", 0, 0.1),
        run("baseline", "steady", 0, 0.12),
    ]
    table = startup.summarise(runs, ["ours", "baseline"])
    assert table["t2mlr/cold"]["ours"]["to_first_step"] == 12.0
    assert table["t2mlr/cold"]["ours"]["phases"] == phases
    assert table["t2mlr/cold"]["baseline"]["ratio"] == 6.0  # of the ratios 6, 3, 6 (not 60 / 12)
    assert table["t2mlr/steady"]["baseline"]["ratio"] == pytest.approx(1.2)
    assert "t2mlr/warm" not in table
    text = startup.markdown(table, ["ours", "baseline"])
    assert "| t2mlr/cold | 12 s | 60 s | 6.00× | 1.00 |" in text and "0.1 s/step" in text


@pytest.mark.slow
def test_a_run_stops_at_its_first_step_and_its_phases_add_up(tmp_path):
    record = startup.run_once(
        startup.sys.executable, startup.ROOT, "t2mlr", tmp_path / "cache", tmp_path / "run", timeout=300.0
    )
    assert list(record["phases"]) == list(startup.PHASES) and record["step"] == 1
    # the phases run from the process's start (read from /proc in 10 ms clock ticks) to the first step's
    # end; the bar showing that step is seen a moment later
    assert -0.05 <= record["to_first_step"] - record["seconds"] < 1.0
    assert not (tmp_path / "run" / "summary.json").exists()  # stopped there
