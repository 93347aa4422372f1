import numpy as np
import pytest
import tokenizers
from tokenizers import models

from t2mlr_jax.data.tokenizer import load_tokenizer, token_byte_lengths

pytestmark = pytest.mark.xdist_group("gguf_tokenizer")  # its module fixtures, built by one worker


@pytest.fixture(scope="module")
def reference(gguf_path):
    import transformers

    folder, name = gguf_path.rsplit("/", 1)
    return transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)


def test_gguf_conversion_matches_transformers(smollm2, reference, english_paragraph):
    ids = smollm2.encode(english_paragraph).tolist()
    assert len(ids) > 1000
    assert ids == reference(english_paragraph, add_special_tokens=False).input_ids
    special = "Hi<|im_start|>user\nx 12345  tabs\t\té 🤗 don't<|im_end|>"
    assert smollm2.encode(special).tolist() == reference(special, add_special_tokens=False).input_ids
    assert smollm2.decode(smollm2.encode(special)) == special
    assert smollm2.vocab_size == len(reference) == 49152
    assert smollm2.eos_id == reference.eos_token_id == 2


def test_digits_are_isolated_before_the_gpt2_split_like_llama_cpp_smollm(smollm2, reference):
    # llama.cpp's "smollm" pre-tokenizer (and SmolLM2's tokenizer.json) split digits off first, so a run of
    # whitespace before a digit stays one piece; transformers' GGUF converter skips that step and differs
    # only there.
    assert smollm2.decode(smollm2.encode("a\n 7")[1:2]) == "\n "
    assert reference("a\n 7", add_special_tokens=False).input_ids != smollm2.encode("a\n 7").tolist()
    assert smollm2.decode(smollm2.encode("2024")[:1]) == "2"


def test_chat_prompt_matches_the_gguf_chat_template(smollm2, reference):
    messages = [{"role": "user", "content": "What is 2+2?"}]
    expected = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert smollm2.chat_prompt("What is 2+2?") == expected


def test_tokenizer_json_folder_loads_with_its_eos(tokenizer_dir, smollm2, english_paragraph):
    loaded = load_tokenizer(tokenizer_dir)
    assert loaded.eos_id == 2
    assert (loaded.encode(english_paragraph) == smollm2.encode(english_paragraph)).all()
    assert load_tokenizer(tokenizer_dir + "/tokenizer.json", eos_token="<|endoftext|>").eos_id == 0


def test_bad_tokenizer_paths_raise(tmp_path, tokenizer_dir):
    with pytest.raises(ValueError, match="does not exist"):
        load_tokenizer(str(tmp_path / "missing.gguf"))
    with pytest.raises(ValueError, match="no tokenizer.json"):
        load_tokenizer(str(tmp_path))
    with pytest.raises(ValueError, match="not in the vocabulary"):
        load_tokenizer(tokenizer_dir, eos_token="<nope>")


@pytest.mark.parametrize(
    "text",
    [
        "héllo wörld ✓ 日本",
        "Hi<|im_start|>user\nx 12345  tabs\t\té 🤗 don't<|im_end|>",
        " \n\n  a\x00b\x7f",
        "",
    ],
)
def test_token_byte_lengths_sum_to_the_utf8_length(smollm2, text):
    lengths = smollm2.byte_lengths
    assert lengths.dtype == np.int32 and lengths.shape == (smollm2.vocab_size,)
    specials = "<|im_start|>", "<|im_end|>"
    expected = len(text.encode("utf-8")) - sum(text.count(s) * len(s) for s in specials)
    assert int(lengths[smollm2.encode(text)].sum()) == expected


def test_token_byte_lengths_count_partial_characters_and_zero_specials(smollm2, english_paragraph):
    lengths = token_byte_lengths(smollm2)
    assert (lengths == smollm2.byte_lengths).all()
    ids = smollm2.encode(english_paragraph)
    assert int(lengths[ids].sum()) == len(english_paragraph.encode("utf-8"))
    # "✓" is 3 bytes split over several byte-level tokens: each counts its own bytes, not a decoded "�".
    check = smollm2.encode("✓")
    assert len(check) > 1 and (lengths[check] < 3).all() and lengths[check].sum() == 3
    for special in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        assert lengths[smollm2.backend.token_to_id(special)] == 0
    assert lengths[smollm2.eos_id] == 0 and (lengths[17:] > 0).all()


def test_token_byte_lengths_survive_a_tokenizer_json_and_refuse_other_models(tokenizer_dir, smollm2):
    assert (load_tokenizer(tokenizer_dir).byte_lengths == smollm2.byte_lengths).all()
    word_level = tokenizers.Tokenizer(models.WordLevel({"a": 0, "<unk>": 1}, unk_token="<unk>"))
    with pytest.raises(ValueError, match="byte-level"):
        token_byte_lengths(word_level)


def test_tokenizing_lets_other_threads_run(smollm2, english_paragraph):
    """A data thread tokenizing a document must not hold the GIL (a single-text `backend.encode` does):
    held, the training thread's tracing waits on it. With thread switching made all but impossible, the
    main thread gets to run while another thread's `encode` is still working only if encode let go of the
    GIL; the raw backend call, the control, finishes first."""
    import sys
    import threading

    text = english_paragraph * 100  # 600 KB: ~0.3 s of tokenizing

    def main_runs_during(encode) -> bool:
        started, finished = threading.Event(), []
        worker = threading.Thread(target=lambda: (started.set(), encode(text), finished.append(True)))
        interval = sys.getswitchinterval()
        sys.setswitchinterval(1000.0)  # no forced switch: a thread gives up the GIL only by releasing it
        try:
            worker.start()
            started.wait()
            during = not finished  # the main thread runs again: is the worker still encoding?
        finally:
            sys.setswitchinterval(interval)
            worker.join()
        return during

    assert main_runs_during(smollm2.encode)
    assert not main_runs_during(lambda t: smollm2.backend.encode(t, add_special_tokens=False))
