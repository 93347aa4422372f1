"""What a researcher gets from `tools/convert_checkpoint.py --to hf | t2mlr-torch`: tokenizer files and token
ids that plain transformers uses (checked in a subprocess that never imports t2mlr_jax), config floats as HF
writes them, a model card with the --verify figures, --verify-text, one-line errors for bad input, and a
non-empty target refused unless --overwrite, which leaves no file of the earlier model."""

import json
import shutil
import stat
import subprocess
import sys

import numpy as np
import pytest
import torch

from configs.recipes import smollm2_tokenizer
from t2mlr_jax.data.tokenizer import load_tokenizer
from t2mlr_jax.formats.files import json_floats, new_file_mode
from t2mlr_jax.formats.tokenizer_files import read_tokenizer
from t2mlr_jax.interop import load_hf, load_params, save_hf, save_params, save_t2mlr_torch
from tests.data.test_tools import load_tool
from tests.interop.helpers import trees_identical
from tests.interop.test_cli import convert
from tests.tiny import interop_config, random_params

GGUF = smollm2_tokenizer()
SENTENCE = "Hello world, 12345 héllo <|im_end|> done."
TEXT = (
    "The quick brown fox jumps over the lazy dog. A converted checkpoint should predict the same next "
    "tokens on both sides of the conversion, on real text as on random tokens."
)
FLOAT32_EPS = float(np.float32(1e-5))  # what a GGUF's norm_eps reads as: 9.999999747378752e-06


pytestmark = pytest.mark.xdist_group("export")  # its module fixtures, built by one worker


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(GGUF)


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tokenizer):
    """Orbax checkpoints (a T²MLR model with SmolLM2's vocabulary and a float32 norm_eps; a plain one with
    61 tokens) and the T²MLR model's two exports with the GGUF's tokenizer, verified."""
    tmp = tmp_path_factory.mktemp("export")
    cfg = interop_config().replace(vocab_size=tokenizer.vocab_size, norm_eps=FLOAT32_EPS)
    params = random_params(cfg)
    # Channel 0 of every embedding is large and only EOS reads it from the head: EOS is always the argmax.
    params["embed_tokens"] = params["embed_tokens"].at[:, 0].set(30.0)
    params["lm_head"] = params["lm_head"].at[0, tokenizer.eos_id].set(10.0)
    save_params(tmp / "t2mlr", cfg, params)
    plain = interop_config().replace(recurrence=None)
    save_params(tmp / "plain", plain, random_params(plain))
    (tmp / "text.txt").write_text(TEXT)
    common = ("--from", "orbax", tmp / "t2mlr", "--tokenizer", GGUF, "--num-sequences", 2, "--seq-len", 8)
    assert (
        convert(*common, "--to", "hf", tmp / "hf", "--drop-recurrence", "--verify-text", tmp / "text.txt")
        == 0
    )
    assert convert(*common, "--to", "t2mlr-torch", tmp / "release", "--verify") == 0
    return tmp


TRANSFORMERS_CHECKS = """
import json, sys
from transformers import AutoModelForCausalLM, AutoTokenizer

hf, release, sentence = sys.argv[1:]
tokenizer = AutoTokenizer.from_pretrained(hf)
model = AutoModelForCausalLM.from_pretrained(hf)
prompt = tokenizer(sentence, return_tensors="pt")
print(json.dumps({
    "ids": {name: AutoTokenizer.from_pretrained(path)(sentence)["input_ids"] for name, path in
            (("hf", hf), ("release", release))},
    "generated": model.generate(**prompt, max_new_tokens=5)[0, prompt.input_ids.shape[1]:].tolist(),
    "generation_config": [getattr(model.generation_config, f"{k}_token_id") for k in ("bos", "eos", "pad")],
    "chat": tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                          add_generation_prompt=True),
    "imported_ours": any(name.startswith("t2mlr_jax") for name in sys.modules),
}))
"""


@pytest.fixture(scope="module")
def transformers_view(folders):
    """What plain transformers makes of the exports, in one subprocess."""
    run = subprocess.run(
        [sys.executable, "-c", TRANSFORMERS_CHECKS, folders / "hf", folders / "release", SENTENCE],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    view = json.loads(run.stdout.splitlines()[-1])
    assert not view["imported_ours"]
    return view


@pytest.mark.slow
def test_autotokenizer_gives_our_ids_and_chat_format(transformers_view, tokenizer):
    ours = tokenizer.encode(SENTENCE).tolist()
    assert transformers_view["ids"] == {"hf": ours, "release": ours}
    assert transformers_view["chat"] == tokenizer.chat_prompt("Hi")  # the GGUF's chat template


@pytest.mark.slow
def test_generate_stops_at_eos(transformers_view, tokenizer):
    assert tokenizer.eos_id == 2
    assert transformers_view["generation_config"] == [1, 2, 2]  # the GGUF's bos, eos and padding ids
    assert transformers_view["generated"] == [tokenizer.eos_id]  # EOS is the argmax: generation stops


def test_tokenizer_json_special_tokens(folders, tmp_path):
    """An export's tokenizer files read back as the GGUF's tokenizer; a tokenizer.json whose config names
    the EOS alone (as tools/train_tokenizer.py writes it) gets HF's GPT-2 convention, bos = pad = eos."""
    exported = read_tokenizer(folders / "hf")
    assert exported.special == {"bos": "<|im_start|>", "eos": "<|im_end|>", "pad": "<|im_end|>"}
    assert exported.token_ids == {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}
    assert exported.chat_template.startswith("{% for message in messages %}")
    shutil.copy(folders / "hf" / "tokenizer.json", tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    bare = read_tokenizer(tmp_path / "tokenizer.json")
    assert bare.token_ids == dict.fromkeys(("bos_token_id", "eos_token_id", "pad_token_id"), 0)
    assert bare.chat_template is None


def test_config_floats_are_written_as_hf_does(folders):
    hf = json.loads((folders / "hf" / "config.json").read_text())
    release = json.loads((folders / "release" / "config.json").read_text())
    assert hf["rms_norm_eps"] == release["base_config"]["rms_norm_eps"] == 1e-05
    assert (hf["bos_token_id"], hf["eos_token_id"], hf["pad_token_id"]) == (1, 2, 2)
    assert (release["eos_token_id"], release["base_config"]["eos_token_id"]) == (2, 2)
    for folder in ("hf", "release"):
        assert "9.99999" not in (folders / folder / "config.json").read_text()
    assert load_params(folders / "t2mlr")[0].norm_eps == FLOAT32_EPS  # our config keeps what it read
    float32 = {"a": float(np.float32(0.1)), "b": [float(np.float32(1e-6))], "c": 0.02, "d": 1e-6, "e": 3}
    assert json_floats(float32) == {"a": 0.1, "b": [1e-06], "c": 0.02, "d": 1e-6, "e": 3}


def test_verify_text_report_has_a_text_section(folders):
    report = json.loads((folders / "hf.verify.json").read_text())
    fields = {"num_sequences", "seq_len", "max_abs_logit_diff", "max_rel_logit_diff", "tolerance", "passed"}
    assert fields <= set(report) and fields <= set(report["text"])
    assert report["passed"] and report["text"]["passed"] and report["text"]["seq_len"] == 8
    assert report["text"]["file"] == str(folders / "text.txt")
    assert "text" not in json.loads((folders / "release.verify.json").read_text())


def test_model_card_describes_the_export(folders):
    for folder, specific in (
        ("hf", ("AutoModelForCausalLM", "--drop-recurrence")),
        ("release", ("T2MLRReference",)),
    ):
        card = (folders / folder / "README.md").read_text()
        report = json.loads((folders / f"{folder}.verify.json").read_text())
        figures = [f"{section['max_abs_logit_diff']:.3g}" for section in (report, report.get("text", report))]
        for expected in (
            "| layers | 4 |",
            "| vocabulary | 49152 |",
            "paper notation (2, 3) (1-based, inclusive) = our code's l_start=1, l_end=2",
            "Mixer: `gated`",
            "D = 16, B = 4",
            f"`{folders / 't2mlr'}` (orbax)",
            f"Tokenizer: `{GGUF}`",
            *specific,
            *figures,
        ):
            assert expected in card, (folder, expected)


def test_export_without_tokenizer_says_how_to_add_one(folders, tmp_path, capsys):
    assert convert("--from", "orbax", "--to", "hf", folders / "plain", tmp_path / "hf") == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "no tokenizer" in warnings[0] and "--tokenizer" in warnings[0]
    assert {p.name for p in (tmp_path / "hf").iterdir()} == {"config.json", "model.safetensors", "README.md"}
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["eos_token_id"] is None
    assert "Not verified" in (tmp_path / "hf" / "README.md").read_text()


@pytest.fixture(scope="module")
def trained_tokenizer_export(tmp_path_factory):
    """(tokenizer folder, HF export): a 300-token BPE trained by tools/train_tokenizer.py on TEXT and
    SENTENCE, and a plain tiny model of that vocabulary exported with it."""
    tmp = tmp_path_factory.mktemp("trained_tokenizer")
    (tmp / "corpus.txt").write_text((TEXT + " " + SENTENCE + "\n") * 20)
    argv = ["--input", tmp / "corpus.txt", "--out", tmp / "tokenizer", "--vocab_size", 300]
    assert load_tool("train_tokenizer").main([str(a) for a in argv]) == 0
    cfg = interop_config().replace(vocab_size=300, recurrence=None)
    save_params(tmp / "plain", cfg, random_params(cfg))
    assert (
        convert("--from", "orbax", "--to", "hf", tmp / "plain", tmp / "hf", "--tokenizer", tmp / "tokenizer")
        == 0
    )
    return tmp / "tokenizer", tmp / "hf"


def test_an_export_with_a_trained_tokenizer_loads_in_autotokenizer_with_our_ids(trained_tokenizer_export):
    """A tokenizer of tools/train_tokenizer.py travels with the export: transformers' AutoTokenizer reads the
    folder and gives our ids (special tokens single, no BOS added), decodes them back, and its EOS is ours,
    as are the ids in config.json and generation_config.json."""
    from transformers import AutoTokenizer

    trained, hf = trained_tokenizer_export
    ours = load_tokenizer(str(trained))
    theirs = AutoTokenizer.from_pretrained(hf)
    for text in (SENTENCE, TEXT, "<|im_start|>user\nunseen: ∑ ü 🤗<|im_end|><|endoftext|>"):
        ids = ours.encode(text).tolist()
        assert theirs(text)["input_ids"] == ids and theirs.decode(ids) == text
    assert theirs.eos_token == "<|endoftext|>" and theirs.eos_token_id == ours.eos_id == 0
    assert len(theirs) == ours.vocab_size == 300
    for name in ("config.json", "generation_config.json"):
        assert json.loads((hf / name).read_text())["eos_token_id"] == ours.eos_id, name


BAD_INPUTS = {
    "unknown source": (("--from", "orbax", "--to", "hf", "{tmp}/nope", "{target}"), "does not exist"),
    "not the stated format": (("--from", "hf", "--to", "orbax", "{t2mlr}", "{target}"), "not a --from hf"),
    "orbax target exists": (("--from", "hf", "--to", "orbax", "{hf}", "{plain}"), "is not empty"),
    "verify-text file missing": (
        ("--from", "orbax", "--to", "hf", "{plain}", "{target}", "--verify-text", "{tmp}/none.txt"),
        "no such file",
    ),
    "verify-text without tokenizer": (
        ("--from", "orbax", "--to", "hf", "{plain}", "{target}", "--verify-text", "{text}"),
        "needs a tokenizer",
    ),
    "verify-text too short": (
        (
            "--from",
            "orbax",
            "--to",
            "t2mlr-torch",
            "{t2mlr}",
            "{target}",
            "--tokenizer",
            GGUF,
            "--verify-text",
            "{text}",
            "--seq-len",
            512,
        ),
        "use a longer text or lower --num-sequences / --seq-len",
    ),  # fmt: skip
    "T²MLR to hf": (
        ("--from", "orbax", "--to", "hf", "{t2mlr}", "{target}"),
        "pass --drop-recurrence to export the backbone alone, or use --to t2mlr-torch",
    ),
    "plain to t2mlr-torch": (
        ("--from", "orbax", "--to", "t2mlr-torch", "{plain}", "{target}"),
        "use --to hf",
    ),
    "tokenizer too large": (
        ("--from", "orbax", "--to", "hf", "{plain}", "{target}", "--tokenizer", "{hf}"),
        "not this model's tokenizer",
    ),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_is_one_error_line_and_writes_nothing(case, folders, tmp_path, capsys):
    argv, message = BAD_INPUTS[case]
    paths = {name: folders / name for name in ("t2mlr", "plain", "hf")}
    paths.update(tmp=tmp_path, target=tmp_path / "target", text=folders / "text.txt")
    before = sorted(p.name for p in folders.iterdir())
    assert convert(*(str(a).format(**paths) for a in argv)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert not (tmp_path / "target").exists() and sorted(p.name for p in folders.iterdir()) == before


# ---------------------------------------------------------------------------------------------
# Exporting into an existing folder: refused, or with --overwrite, no file of the earlier model is left.


def snapshot(folder) -> dict:
    """Every file under `folder`: its bytes and mode."""
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mode)
        for p in folder.rglob("*")
        if p.is_file()
    }


def stale_model(folder) -> None:
    """What an earlier sharded model and a download leave: an index and its two shards, a .bin, config and
    tokenizer files (config.json private, 0o600), and the user's own notes and sub-folder."""
    from safetensors.torch import save_file

    folder.mkdir()
    shards = [f"model-0000{i}-of-00002.safetensors" for i in (1, 2)]
    for name, key in zip(shards, ("model.embed_tokens.weight", "lm_head.weight")):
        save_file({key: torch.zeros(3, 3)}, str(folder / name))
    index = {"metadata": {}, "weight_map": dict(zip(("model.embed_tokens.weight", "lm_head.weight"), shards))}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    torch.save({"model.norm.weight": torch.ones(3)}, folder / "pytorch_model.bin")
    for name in ("config.json", "chat_template.jinja", "tokenizer.model"):
        (folder / name).write_text("{}")
    (folder / "config.json").chmod(0o600)
    (folder / "notes.txt").write_text("mine")
    (folder / "eval").mkdir()
    (folder / "eval" / "results.json").write_text("{}")


@pytest.mark.parametrize("to, source", [("hf", "plain"), ("t2mlr-torch", "t2mlr"), ("orbax", "hf")])
def test_a_non_empty_target_is_refused_and_left_alone(to, source, folders, tmp_path, capsys):
    target = tmp_path / "target"
    stale_model(target)
    before = snapshot(target)
    source_format = "hf" if to == "orbax" else "orbax"
    assert convert("--from", source_format, "--to", to, folders / source, target) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {target} is not empty: choose a new folder, or pass --overwrite (overwrite=True) "
                   "to replace the model in it"]  # fmt: skip
    assert snapshot(target) == before


def test_overwrite_replaces_the_model_and_keeps_other_files(folders, tmp_path):
    """With --overwrite, the stale index, shards, .bin and tokenizer files are gone (today's loader read the
    index's shards), our loader reads the new model, the user's files stay, and every file written has the
    mode a new file gets."""
    target = tmp_path / "target"
    stale_model(target)
    kept = {
        name: value for name, value in snapshot(target).items() if name in ("notes.txt", "eval/results.json")
    }
    assert convert("--from", "orbax", "--to", "hf", folders / "plain", target, "--overwrite") == 0
    files = snapshot(target)
    assert set(files) == {"config.json", "model.safetensors", "README.md", *kept}
    assert {name: files[name] for name in kept} == kept
    cfg, params = load_hf(target)
    expected_cfg, expected = load_params(folders / "plain")
    assert cfg == expected_cfg and trees_identical(params, expected)
    written = {name: stat.S_IMODE(mode) for name, (_, mode) in files.items() if name not in kept}
    assert set(written.values()) == {new_file_mode()}, written


def test_every_writer_shares_the_refusal(folders, tmp_path):
    """save_hf, save_t2mlr_torch and save_params refuse a non-empty folder before converting anything;
    save_params(overwrite=True) replaces an exported orbax folder whole and nothing else."""
    cfg, params = load_params(folders / "t2mlr")
    target = tmp_path / "target"
    stale_model(target)
    before = snapshot(target)
    for save in (
        lambda **kw: save_hf(cfg, params, target, drop_recurrence=True, **kw),
        lambda **kw: save_t2mlr_torch(cfg, params, target, **kw),
        lambda **kw: save_params(target, cfg, params, **kw),
    ):
        with pytest.raises(ValueError, match="is not empty: choose a new folder, or pass --overwrite"):
            save()
    with pytest.raises(ValueError, match="not an exported orbax folder"):
        save_params(target, cfg, params, overwrite=True)
    assert snapshot(target) == before
    orbax = tmp_path / "orbax"
    shutil.copytree(folders / "plain", orbax)
    save_params(orbax, cfg, params, overwrite=True)
    loaded_cfg, loaded = load_params(orbax)
    assert loaded_cfg == cfg and trees_identical(loaded, params)
