"""Bad input to main.py (missing or empty data, a model that cannot hold the data, config typos, bad values,
nothing to evaluate, a negative learning rate, B > D): one `error:` line, exit status 2, before anything
compiles, and no workdir created."""

import os

import pytest

from tests.test_main import ROOT, S5, main


def _bad_inputs(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    gsm = os.path.join(ROOT, "configs", "gsm8k.py") + ":cpu"
    return {
        "missing data": (
            [f"--config={gsm}", "--config.data.train_path=/no/such/file.jsonl"],
            "does not exist",
        ),
        "empty file": ([f"--config={gsm}", f"--config.data.train_path={empty}"], "empty file"),
        "too long": (
            [f"--config={S5}:cpu", "--config.model.max_seq_len=16"],
            "longer than the model's context",
        ),
        "vocab": ([f"--config={S5}:cpu", "--config.model.vocab_size=100"], "tokenizer/vocab mismatch"),
        "config typo": (
            [f"--config={S5}:cpu", "--config.data.trainpath=x"],
            "--config.data.trainpath: no such config field (did you mean 'data.train_path'",
        ),
        "unknown preset": ([f"--config={S5}:cpux"], "unknown preset 'cpux' (did you mean 'cpu'?)"),
        "missing config": (["--config=configs/s5_retrival.py"], "does not exist"),
        "bad value": ([f"--config={S5}:cpu", "--config.train.steps=abc"], "flag --config.train.steps=abc"),
        "unknown flag": (["--workdirr=x"], "Did you mean: workdir"),
        "eval with nothing to load": ([f"--config={S5}:cpu", "--mode=eval"], "no config.init_from"),
        "negative learning rate": ([f"--config={S5}:cpu", "--config.optimizer.lr=-1"], "optimizer.lr must"),
        "B > D": (
            [f"--config={S5}:cpu", "--config.model.recurrence.d_backward=40"],
            "d_backward (B = 40) must be <= d_forward (D = 16)",
        ),
        "the headline without data": (
            [f"--config={os.path.join(ROOT, 'configs', 'smollm135m_t2mlr.py')}"],
            "10.0B tokens, sized for accelerators",
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "missing data",
        "empty file",
        "too long",
        "vocab",
        "config typo",
        "unknown preset",
        "missing config",
        "bad value",
        "unknown flag",
        "eval with nothing to load",
        "negative learning rate",
        "B > D",
        "the headline without data",
    ],
)
def test_bad_input_is_one_clear_error_before_compiling(tmp_path, case):
    args, message = _bad_inputs(tmp_path)[case]
    out = main(*args, f"--workdir={tmp_path / 'run'}")
    assert out.returncode == 2, out.stderr[-2000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0]
    assert "Traceback" not in out.stderr and "Compiling" not in out.stderr
    assert not (tmp_path / "run").exists()
