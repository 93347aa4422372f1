"""experiments/lrt_comparison.py: --help, the paper preset's one-line error without data, and one in-process
run of two rows (vanilla1x and tt1) at a drastically reduced size (1 step, one play of Shakespeare, a few
eval rows of 16 tokens) writing results.json / .md / .png with finite BPB and tt1's BPB-vs-K table, then a
rerun that trains nothing. The BPB values themselves are not tested."""

import functools
import json
import math

import pytest

from configs.recipes import shakespeare_split
from t2mlr_jax.data import tokenizer
from t2mlr_jax.studies import lrt_comparison, lrt_comparison_runs
from t2mlr_jax.train import build_data

SHORT = 16  # reference tokens per row (the cpu preset's 64, a thought row's context x (K + 1) of it)


@pytest.fixture
def small_and_quick(monkeypatch):
    """The cpu preset with 16-token reference rows (the exact recurrence evaluates them token by token), and
    the SmolLM2 GGUF's tokenizer read once: each row's data source, the pretokenizing and the rerun would
    each read its 49k-entry vocabulary again (~1.6 s apiece under the tests' run-time type checks)."""
    row_config = lrt_comparison.row_config

    def short_rows(row, args):
        config = row_config(row, args)
        slots = config.data.seq_len // config.eval.window
        config.model.max_seq_len = config.data.seq_len = slots * SHORT
        config.eval.window = SHORT
        return config

    monkeypatch.setattr(lrt_comparison, "row_config", short_rows)
    load_once = functools.cache(tokenizer.load_tokenizer)
    monkeypatch.setattr(tokenizer, "load_tokenizer", load_once)  # pretokenize's
    monkeypatch.setattr(build_data, "load_tokenizer", load_once)  # build_data_source's


def test_help_lists_the_flags(capsys):
    with pytest.raises(SystemExit) as exit_info:
        lrt_comparison.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--preset", "--rows", "--out", "--flop_budget", "--eval_thoughts", "--seeds", "--probe"):
        assert flag in out
    with pytest.raises(SystemExit, match="unknown"):
        lrt_comparison.resolve_rows("tt1,tt3")
    assert lrt_comparison.resolve_rows("tt2,vanilla1x,no_kv") == ["vanilla1x", "tt2", "no_kv"]


def test_paper_preset_without_data_fails_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        lrt_comparison.main(["--preset=paper", "--rows=tt1", f"--out={tmp_path / 'out'}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --preset=paper needs --train_path") and "\n" not in err
    assert not (tmp_path / "out").exists()
    with pytest.raises(SystemExit) as exit_info:
        lrt_comparison.main(["--preset=paper", "--rows=tt1", "--workers=0", f"--out={tmp_path / 'out'}"])
    assert (
        exit_info.value.code == 2
        and capsys.readouterr().err == "error: --workers must be at least 1, got 0\n"
    )
    with pytest.raises(SystemExit) as exit_info:  # the probe checks the study's recipe only
        lrt_comparison.main(["--preset=cpu", "--probe", f"--out={tmp_path / 'out'}"])
    assert exit_info.value.code == 2 and "give --preset=study" in capsys.readouterr().err


@pytest.mark.slow
def test_two_rows_write_the_tables_and_the_figure(tmp_path, small_and_quick):
    train, heldout = shakespeare_split()
    out = tmp_path / "out"
    argv = [
        "--preset=cpu",
        "--rows=tt1,vanilla1x",
        f"--out={out}",
        "--steps=1",
        "--batch_size=8",  # the tests' 8 CPU devices split the batch
        "--eval_examples=8",
        "--eval_batch_size=8",
        "--eval_thoughts=2",
        f"--train_path={train.split(',')[0]}",
        f"--eval_path={heldout.split(',')[0]}",
    ]
    journal = out / "rows.jsonl"
    # A shard (what --workers runs) trains only its rows (every 2nd from the 2nd: tt1) and tabulates nothing
    assert lrt_comparison.main([*argv, "--shard=1/2"])["rows"] == {}
    assert not (out / "results.json").exists()
    assert [json.loads(line)["row"] for line in journal.read_text().splitlines()] == ["tt1"]
    # the whole command trains the rest, reads tt1 back and tabulates both
    first = lrt_comparison.main(argv)
    assert list(first["meta"]["row_seconds"]) == ["vanilla1x"]  # what this invocation computed
    result = json.loads((out / "results.json").read_text())
    rows = result["rows"]
    assert list(rows) == ["vanilla1x", "tt1"]  # the paper's order
    for name, row in rows.items():
        assert math.isfinite(row["bpb"]) and row["bpb"] > 0, name
        assert row["steps"] == 1 and row["train_flops"] == row["flops_per_step"] > 0
        assert row["label"] == lrt_comparison.ROWS[name].label
    assert rows["vanilla1x"]["params_ratio"] == 1.0 and rows["tt1"]["params_ratio"] > 1.0
    assert (rows["vanilla1x"]["blocks"], rows["tt1"]["blocks"]) == (2, 4)  # L and L x (K + 1)
    assert rows["tt1"]["thoughts"] == 1 and rows["tt1"]["thoughts_trained"] == [0, 1]
    assert set(rows["tt1"]["bpb_by_k"]) == {"1", "2"}  # its own K and --eval_thoughts
    assert rows["tt1"]["bpb_by_k"]["1"] == rows["tt1"]["bpb"]
    assert all(math.isfinite(v) for v in rows["tt1"]["bpb_by_k"].values())
    markdown = (out / "results.md").read_text()
    assert "## Table 1" in markdown and "## Table 2" in markdown and "K=2" in markdown and "†" in markdown
    assert "LRT + 1 thought token" in markdown and "Transformer 1x" in markdown
    assert (out / "results.png").stat().st_size > 0
    assert [json.loads(line)["row"] for line in journal.read_text().splitlines()] == ["tt1", "vanilla1x"]
    # A rerun trains and evaluates nothing again: every row has its summary and its per-K evaluations.
    again = lrt_comparison.main(argv)
    assert {n: r["bpb_by_k"] for n, r in again["rows"].items()} == {n: r["bpb_by_k"] for n, r in rows.items()}
    assert len(journal.read_text().splitlines()) == 2 and again["meta"]["row_seconds"] == {}


def test_study_rows_take_equal_steps_and_figure3_rows_equal_flops_too():
    """--preset=study's matching, built without training: every row the same steps on the same unique text
    (Tables 1-3), the cap what the row reading least reads, whatever --rows selects; Figure 3's rows also
    trained at the steps that spend the double-depth transformer's FLOPs (head and every pass counted), the
    reference itself at its own steps (one run, not two); and the study's recipe on every row."""
    from argparse import Namespace

    from t2mlr_jax.architectures import build_architecture, flops_per_step
    from t2mlr_jax.train.trainer import tokens_read

    args = Namespace(**dict.fromkeys(("steps", "batch_size", "eval_examples", "eval_batch_size"), None))
    args.__dict__.update(preset="study", train_path=None, eval_path=None, tokenizer=None, flop_budget=0.0)
    reference = lrt_comparison.resolved(lrt_comparison.row_config("vanilla2x", args))
    budget = reference.train.steps * flops_per_step(reference, build_architecture(reference))
    configs = lrt_comparison.run_configs(list(lrt_comparison.ROWS), args, budget)
    typed = {name: lrt_comparison.resolved(c) for name, c in configs.items()}
    study = lrt_comparison.ROWS_CONFIG
    assert {typed[row].train.steps for row in lrt_comparison.ROWS} == {study.STUDY_STEPS}
    matched = {name for name in configs if name.endswith("@flops")}
    assert matched == {f"{row}@flops" for row in lrt_comparison.FIGURE3}
    for name in matched:
        per_step = flops_per_step(typed[name], build_architecture(typed[name]))
        assert typed[name].train.steps * per_step == pytest.approx(budget, rel=per_step / budget)
    assert typed["vanilla2x@flops"].train.steps == typed["vanilla2x"].train.steps  # the reference: one run
    assert typed["tt1@flops"].train.steps < study.STUDY_STEPS / 2  # ~2.6x vanilla2x's FLOPs per step
    for row in ("vanilla1x", "lrt3x", "tt2"):
        assert (
            0 < lrt_comparison_runs.head_share_of(configs[row]) <= 0.25
        )  # the study's vocabulary keeps the head small
    reads = {
        row: tokens_read(typed[row], typed[row].train.steps)["train_tokens_read"]
        for row in lrt_comparison.ROWS
    }
    assert lrt_comparison.equal_data(args) == min(reads.values()) == reads["vanilla1x"]
    assert reads["fixed_k4"] == 5 * reads["vanilla1x"]  # thought rows read (K + 1) x the slots: epochs
    for name in ("vanilla3x", "tt1@flops"):  # the recipe, fixed before any row ran
        opt = typed[name].optimizer
        assert (opt.lr_multiplier, opt.warmup_ratio, opt.grad_clip) == (study.STUDY_LR_MULTIPLIER, 0.2, 1.0)
        assert (opt.sections["muon"].decay_depth, opt.sections["muon"].batch_tokens) == (12, 0)


def test_vocabulary_targets_count_the_vocabulary_tokens_a_thought_row_supervises():
    """At a drawn K a row of S slots supervises S // (K + 1) vocabulary tokens, K uniform over the trained
    ones: tt2 (192 slots, K in {0, 1, 2}) (192 + 96 + 64) / 3, fixed K = 2 (192 slots) 64, vanilla 64."""
    config = lambda row: lrt_comparison.ROWS_CONFIG.get_config(f"{row},study")
    per_row = lrt_comparison.ROWS_CONFIG.vocab_targets_per_row
    assert per_row(config("tt2")) == pytest.approx(352 / 3)
    assert per_row(config("fixed_k2")) == per_row(config("vanilla1x")) == per_row(config("ponder1")) == 64
    assert per_row(config("tt1")) == 96


def test_claims_are_judged_per_table_on_the_rows_that_ran():
    seeds = {0: 0.0, 1: 0.0, 2: 0.0}
    row = lambda bpbs, by_k=None: {
        "thoughts_trained": [0, 1, 2] if by_k else [0],
        "seeds": {
            str(s): {"bpb": b, "bpb_by_k": {str(k): v[s] for k, v in (by_k or {}).items()}}
            for s, b in zip(seeds, bpbs)
        },
    }
    results = {
        "tt1": row([3.00, 3.02, 2.98]),
        "fixed_k1": row([3.10, 3.12, 3.08]),  # 0.10 worse every seed
        "tt2": row([2.90, 2.95, 2.85], {0: [3.0, 3.1, 2.9], 2: [2.90, 2.95, 2.85], 3: [2.91, 2.90, 2.99]}),
    }
    judged = lrt_comparison_runs.comparisons(results)
    # only the claims whose rows ran: Table 1 has just tt2 against tt1
    assert [(c["row"], c["baseline"]) for c in judged["Table 1"]["claims"]] == [("tt2", "tt1")]
    table3 = {(c["row"], c["baseline"]): c for c in judged["Table 3"]["claims"]}
    assert table3[("fixed_k1", "tt1")]["verdict"] == "reproduced at this scale"
    assert table3[("fixed_k1", "tt1")]["difference"]["mean"] == pytest.approx(0.10)
    table2 = {(c["row"], c["baseline"]): c for c in judged["Table 2"]["claims"]}
    assert set(table2) == {("tt1", "fixed_k1"), ("tt2", "tt2@K=0"), ("tt2@K=3", "tt2")}
    assert table2[("tt1", "fixed_k1")]["verdict"] == "reproduced at this scale"
    assert table2[("tt2", "tt2@K=0")]["difference"]["mean"] == pytest.approx(-0.10)
    # Figure 3's claims read the FLOP-matched runs; parity claims are equivalence within PARITY_MARGIN
    flops = {
        "tt1@flops": row([3.000, 3.010, 2.990]),
        "vanilla2x@flops": row([3.005, 3.012, 2.995]),  # within 0.02 on every seed, tightly
        "ponder1@flops": row([3.20, 3.25, 3.15]),
    }
    claims = lrt_comparison_runs.comparisons(flops)["Figure 3"]["claims"]
    figure3 = {(c["row"], c["baseline"]): c for c in claims}
    assert figure3[("tt1@flops", "ponder1@flops")]["verdict"] == "reproduced at this scale"
    parity = figure3[("tt1@flops", "vanilla2x@flops")]
    assert (parity["sign"], parity["margin"], parity["verdict"]) == (0, 0.02, "reproduced at this scale")
    # a claim whose runs were trained under another recipe than pre-registered is not judged
    refused = lrt_comparison_runs.comparisons(
        {**results, **flops}, lambda name: [f"{name}/seed1: optimizer"] * (name == "tt2")
    )
    assert refused["Table 2"]["refused"] == dict.fromkeys(
        ("tt2 vs tt2@K=0", "tt2@K=3 vs tt2"), ["tt2/seed1: optimizer"] * 2
    )
    assert [(c["row"], c["baseline"]) for c in refused["Table 2"]["claims"]] == [("tt1", "fixed_k1")]
    assert "Table 1" not in refused or not refused["Table 1"]["claims"]  # its one claim read tt2


def test_the_report_puts_figure3_rows_at_equal_steps_beside_equal_flops():
    from t2mlr_jax.studies import lrt_comparison_report as report

    def result(row, steps, bpb, targets):
        return {"label": lrt_comparison.ROWS[row].label, "steps": steps, "bpb": bpb, "bpb_interval": None,
                "train_flops": 1e12, "vocab_targets": targets}  # fmt: skip

    results = {
        "tt1": result("tt1", 250, 3.30, 384_000),
        "tt1@flops": result("tt1", 95, 3.40, 145_920),
        "vanilla2x": result("vanilla2x", 250, 3.20, 256_000),
        "vanilla2x@flops": result("vanilla2x", 250, 3.20, 256_000),
    }
    table = report.figure3(results)
    assert "| Transformer 2x (`vanilla2x`) | 250 | 3.2000 | 250 |" in table
    assert "| LRT + 1 thought token (`tt1`) | 250 | 3.3000 | 95 | 1e+12 | 145,920 | 3.4000 |" in table
    assert report.figure3({"tt1": results["tt1"]}) is None  # no FLOP-matched run: no table
