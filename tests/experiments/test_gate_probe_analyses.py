"""experiments/gate_trajectories.py (Fig. 8) and experiments/future_token_probe.py (Table 13).

Gates: the series come out of metrics.jsonl as logged (tanh γ is logged, not transformed again), in step
order, one panel per quantity; the keys it plots are the ones the real train step logs; bad input is one
`error:` line. Probe: the states are the exact recurrence's (the head over the last one gives
exact_forward's logits), the probe for k reads x_{t+k} (a synthetic state that is the one-hot of x_{t+k}
is decoded perfectly by the k probe only: the release's off-by-one would fail it), and the whole CLI on
two tiny exported checkpoints writes results.json / .md / .png."""

import json
import math
from pathlib import Path

import jax
import numpy as np
import pytest
from absl import flags

from configs.recipes import shakespeare_split
from t2mlr_jax.architectures.t2mlr.recurrence import exact_forward
from t2mlr_jax.config.convert import to_dict
from t2mlr_jax.experiment import resolve
from t2mlr_jax.interop import save_params
from t2mlr_jax.interop.pretrained import load_pretrained
from t2mlr_jax.model.backbone import forward, head
from t2mlr_jax.model.token_layout import make_layout
from t2mlr_jax.storage.run_config import run_identity, write_run_config
from t2mlr_jax.studies import future_token_probe as probe
from t2mlr_jax.studies import future_token_probe_fit as fit
from t2mlr_jax.studies import gate_trajectories as gates
from t2mlr_jax.train.metrics_log import MetricsLog
from t2mlr_jax.train.train_step import make_train_step
from t2mlr_jax.train.trainer import Run
from tests import tiny
from tests.data.test_tools import load_tool
from tests.tolerance import assert_fp32_close
from tests.train.tiny_task import tiny_batch, tiny_source

flags.FLAGS.mark_as_parsed()  # grain reads absl flags


GAMMA_REC, GAMMA_IN = "tanh_rezero_gamma_recurrent_gate", "tanh_rezero_gamma_input_gate"
FIG8 = [GAMMA_REC, GAMMA_IN, "gate/recurrent_gate", "gate/input_gate"]
VOCAB = 300  # the probe CLI's tokenizer: a byte-level BPE trained on a few pages of a play


def is_png(path) -> bool:
    return path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


# ---------------------------------------------------------------------------------------------- gates


def write_log(workdir, lines, arch="t2mlr", l_end=-2):
    """A workdir as main.py leaves it: run_config.json (a 4-layer window 1..l_end) and metrics.jsonl."""
    config = tiny.tiny_experiment(arch)
    config.model.num_layers, config.model.recurrence.l_end = 4, l_end
    write_run_config(workdir, {**run_identity(to_dict(resolve(config))), "arch": arch})
    (workdir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_gate_series_are_read_as_logged_in_step_order(tmp_path, capsys):
    # Out of order, a step logged twice (the later line counts), an eval line, values tanh would change.
    lines = [
        {"step": 4, "split": "train", GAMMA_REC: 0.9, GAMMA_IN: -0.5, "gate/recurrent_gate": 0.6},
        {"step": 2, "split": "train", GAMMA_REC: 0.1, GAMMA_IN: -0.1, "gate/recurrent_gate": 0.5},
        {"step": 4, "split": "eval", "loss": 1.0, GAMMA_REC: 7.0},
        {"step": 6, "split": "train", GAMMA_REC: 0.7, GAMMA_IN: -0.6, "gate/recurrent_gate": 0.4},
        {"step": 6, "split": "train", GAMMA_REC: 0.8, GAMMA_IN: -0.7, "gate/recurrent_gate": 0.3},
    ]
    window = tmp_path / "w1"
    window.mkdir()
    write_log(window, lines)
    both = tmp_path / "both"  # a multi-architecture workdir: its transformer logs no gates
    for arch, logged in (("t2mlr", lines[:2]), ("transformer", [{"step": 2, "split": "train", "loss": 3.0}])):
        (both / arch).mkdir(parents=True)
        write_log(both / arch, logged, arch, l_end=3)
    out = tmp_path / "out"
    gates.main([str(window), str(both), f"--out={out}", "--labels=narrow,wide"])

    result = json.loads((out / "results.json").read_text())
    assert result["meta"]["quantities"] == [GAMMA_REC, GAMMA_IN, "gate/recurrent_gate"]
    narrow, wide = result["runs"]
    assert (narrow["label"], narrow["window"], wide["label"], wide["window"]) == (
        "narrow",
        [1, 2],
        "wide",
        [1, 3],
    )
    assert narrow["series"][GAMMA_REC] == {"step": [2, 4, 6], "value": [0.1, 0.9, 0.8]}
    assert narrow["series"][GAMMA_IN] == {"step": [2, 4, 6], "value": [-0.1, -0.5, -0.7]}
    assert narrow["final"] == {GAMMA_REC: 0.8, GAMMA_IN: -0.7, "gate/recurrent_gate": 0.3}
    assert wide["series"][GAMMA_REC] == {"step": [2, 4], "value": [0.1, 0.9]}
    assert is_png(out / "results.png")
    printed = capsys.readouterr().out
    assert "| narrow | 1–2 | 6 | +0.8000 | -0.7000 | +0.3000 |" in printed
    assert printed.startswith((out / "results.md").read_text().strip())


def test_the_trainer_logs_every_fig8_quantity(tmp_path):
    """The metric keys of a real T²MLR train step and its parameter statistics (traced, not compiled),
    written by the trainer's own writers: every quantity of Fig. 8 is found and plotted."""
    run = Run(resolve(tiny.tiny_experiment("t2mlr")), tmp_path / "run", tiny_source(), "t2mlr")
    step = make_train_step(run.arch, run.optimizer, run.schedule)
    _, metrics = jax.eval_shape(step, run.abstract_state(), tiny_batch(0, 1, 8, 16))
    metrics = {
        **metrics,
        **jax.eval_shape(run.arch.param_stats, run.abstract_state().params),
    }  # logging steps'
    write_run_config(run.workdir, run.identity, run.settings)
    with MetricsLog(run.workdir) as log:
        for at in (1, 2):
            log.write(at, "train", {key: math.tanh(at / 10) for key in metrics})
    result = gates.main([str(run.workdir), f"--out={tmp_path / 'out'}"])
    assert result["meta"]["quantities"] == FIG8
    assert result["runs"][0]["window"] == [1, 1] and result["runs"][0]["label"] == "run (layers 1–1)"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["{tmp}/missing"], "is not a directory"),
        (["{tmp}/baseline"], "no gate metrics"),
        ([], "give at least one WORKDIR"),
        (["{tmp}/baseline", "--preset=cpu"], "not both"),
    ],
)
def test_gate_bad_input_is_one_error_line(tmp_path, capsys, argv, message):
    (tmp_path / "baseline").mkdir()
    write_log(tmp_path / "baseline", [{"step": 1, "split": "train", "loss": 2.0}], "transformer")
    with pytest.raises(SystemExit) as exit_info:
        gates.main([a.format(tmp=tmp_path) for a in argv] + [f"--out={tmp_path / 'out'}"])
    assert exit_info.value.code == 2 and message in one_error_line(capsys)
    assert not (tmp_path / "out").exists()


def test_a_cpu_window_stopped_by_a_signal_is_one_error_line(tmp_path, capsys, monkeypatch):
    """The cpu preset's windows run as a table of the study runner: a stopped one ends the command."""
    monkeypatch.setattr(gates, "cpu_config", lambda preset, steps, changes: changes)
    monkeypatch.setattr(gates, "train_run", lambda config, workdir: {"stopped_by": "SIGTERM", "step": 3})
    with pytest.raises(SystemExit) as exit_info:
        gates.train_cpu_windows(tmp_path, 4)
    stopped = f"error: {tmp_path / 'middle'}: stopped by SIGTERM at step 3; rerun to resume"
    assert exit_info.value.code == 2 and stopped in capsys.readouterr().err  # after the progress bar


# ---------------------------------------------------------------------------------------------- probe


@pytest.fixture(scope="module")
def models():
    """A tiny T²MLR (γ = 0.5: the fusion on) and its backbone as a transformer (the same weights without the
    mixer): (config, params) by name."""
    cfg = tiny.tiny_config(vocab_size=VOCAB)
    params = tiny.tiny_params(cfg, gamma=0.5)
    plain = {k: v for k, v in params.items() if k != "mixer"}
    return {"t2mlr": (cfg, params), "transformer": (cfg.replace(recurrence=None), plain)}


def test_the_k_probe_reads_the_token_k_ahead():
    """Layer 0's state is the one-hot of x_{t+1}, layer 1's of x_{t+2}: only the matching k decodes it."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 9, size=(48, 12))
    ahead = lambda k: np.eye(9)[np.pad(tokens[:, k:], ((0, 0), (0, k)))]  # [B, T, 9]: one-hot of x_{t+k}
    features = np.stack([ahead(1), ahead(2)]).astype(np.float32)
    data = fit.probe_data(tokens, np.ones_like(tokens), (1, 2, 3), 16, 0.25, seed=0)
    for i, k in enumerate((1, 2, 3)):
        assert np.array_equal(data.classes[data.labels[i]], tokens[data.rows, data.times + k])
    assert data.times.max() == 12 - 1 - 3 and 0 < data.test.mean() < 0.5
    settings = fit.ProbeSettings(hidden=32, steps=150, batch=64, lr=1e-2)
    accuracy = fit.fit_probes(features[:, data.rows, data.times], data, settings, 0, "probes")["accuracy"]
    assert accuracy[0, 0] == 1.0 and accuracy[1, 1] == 1.0
    assert accuracy[0, 1:].max() < 0.5 and accuracy[1, [0, 2]].max() < 0.5


@pytest.fixture(scope="module")
def checkpoints(models, tmp_path_factory):
    """The two tiny models exported as --checkpoint folders, recording a tokenizer of VOCAB tokens trained
    (tools/train_tokenizer.py) on the text they are probed on: a few pages of a held-out play."""
    folder = tmp_path_factory.mktemp("checkpoints")
    play = Path(shakespeare_split()[1].split(",")[0]).read_text(encoding="utf-8")
    (folder / "text").mkdir()
    (folder / "text" / "play.txt").write_text(play[:20_000], encoding="utf-8")
    train_tokenizer = load_tool("train_tokenizer").main
    assert (
        train_tokenizer([f"--input={folder / 'text'}", f"--out={folder / 'tok'}", f"--vocab_size={VOCAB}"])
        == 0
    )
    for name, (cfg, params) in models.items():
        save_params(folder / name, cfg, params, tokenizer=str(folder / "tok"))
    return [folder / name for name in models], folder / "text" / "play.txt"


@pytest.mark.numerics
def test_states_are_those_of_the_exact_recurrence(checkpoints):
    """On the checkpoints as the CLI loads them, so that its states reuse what this test compiles."""
    (cfg, params), (plain_cfg, plain_params) = (load_pretrained(path) for path in checkpoints[0])
    tokens = tiny.tokens(8, 16, vocab=VOCAB)
    positions = np.array([[*range(8), *range(8)]] + [list(range(16))] * 7)  # row 0: two documents
    segment_ids = np.array([[1] * 8 + [2] * 8] + [[1] * 16] * 7)
    layout = make_layout(tokens, positions, segment_ids)
    got = fit.jitted_layer_states(cfg, params, tokens, layout)
    plain = fit.jitted_layer_states(plain_cfg, plain_params, tokens, make_layout(tokens))
    assert got.shape == (cfg.num_layers, 8, 16, cfg.hidden_size)

    @jax.jit
    def references(params, plain_params, got_last, plain_last):
        return (
            head(cfg, params, got_last),
            exact_forward(cfg, params, tokens, layout=layout).logits,
            head(plain_cfg, plain_params, plain_last),
            forward(plain_cfg, plain_params, tokens),
        )

    from_states, exact, plain_from_states, plain_logits = references(params, plain_params, got[-1], plain[-1])
    depth = tokens.shape[1] * cfg.num_layers  # the exact recurrence's chain over 16 tokens lies within
    assert_fp32_close(from_states, exact, depth, "head of the recurrence's states")
    assert_fp32_close(plain_from_states, plain_logits, plain_cfg.num_layers, "head of the plain states")
    assert tiny.rel_err(got[-1], plain[-1]) > 1e-3  # the fusion is on


def test_the_probe_cli_writes_the_table_and_figure(tmp_path, checkpoints, capsys):
    out = tmp_path / "out"  # chunks of 8 rows x 16 tokens: the states test's shapes
    argv = [
        *(f"--checkpoint={p}" for p in checkpoints[0]),
        f"--data={checkpoints[1]}",
        "--ks=1,3",
        "--layers=0,-1",
        "--seq_len=16",
        "--rows=16",
        "--chunk=8",
        "--hidden=16",
        "--steps=20",
        "--batch=32",
        "--classes=32",
        f"--out={out}",
    ]
    probe.main(argv)
    result = json.loads((out / "results.json").read_text())
    assert result["meta"]["ks"] == [1, 3] and result["meta"]["layers"] == [0, 3]
    assert set(result["meta"]["coverage"]) == {"1", "3"}
    assert list(result["models"]) == ["t2mlr", "transformer"]
    t2mlr, transformer = result["models"].values()
    assert (t2mlr["window"], transformer["window"]) == ([1, 2], None)
    for model in (t2mlr, transformer):
        assert set(model) >= {"checkpoint", "accuracy", "loss"} and set(model["accuracy"]) == {"1", "3"}
        assert all(len(v) == 2 and all(0 <= a <= 1 for a in v) for v in model["accuracy"].values())
    assert is_png(out / "results.png")
    assert (
        "| Layer (block) | k=1 t2mlr | k=1 transformer | k=3 t2mlr | k=3 transformer |"
        in capsys.readouterr().out
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--ks=1,0"], "every k must be >= 1"),
        (["--checkpoint={tmp}/missing"], "does not exist"),
        (["--checkpoint={ckpt}", "--layers=4"], "outside the models' 4 layers"),
        (["--preset=paper"], "needs --checkpoint"),
    ],
)
def test_probe_bad_arguments_are_one_error_line(tmp_path, checkpoints, capsys, monkeypatch, argv, message):
    monkeypatch.setattr(probe, "setup_jax", lambda out: pytest.fail("got past the argument checks"))
    with pytest.raises(SystemExit) as exit_info:
        probe.main(
            [a.format(tmp=tmp_path, ckpt=checkpoints[0][0]) for a in argv] + [f"--out={tmp_path / 'o'}"]
        )
    assert exit_info.value.code == 2 and message in one_error_line(capsys)


def test_help_names_the_flags(capsys):
    for script, shown in ((gates, ("--labels", "--preset")), (probe, ("--checkpoint", "--ks", "--preset"))):
        with pytest.raises(SystemExit) as exit_info:
            script.main(["--help"])
        out = capsys.readouterr().out
        assert exit_info.value.code == 0 and all(flag in out for flag in shown)
