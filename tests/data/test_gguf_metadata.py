import pytest

from t2mlr_jax.data.gguf_metadata import read_gguf_metadata


def test_reads_back_what_gguf_writes(tmp_path):
    import gguf

    path = str(tmp_path / "tiny.gguf")
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_array("tokenizer.ggml.tokens", ["<|endoftext|>", "a", "Ġb", "é"])
    writer.add_array("tokenizer.ggml.token_type", [3, 1, 1, 1])
    writer.add_uint32("tokenizer.ggml.eos_token_id", 0)
    writer.add_float32("x.scale", 0.5)
    writer.add_bool("x.flag", True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    meta = read_gguf_metadata(path)
    assert meta["general.architecture"] == "llama" and meta["tokenizer.ggml.model"] == "gpt2"
    assert meta["tokenizer.ggml.tokens"] == ["<|endoftext|>", "a", "Ġb", "é"]
    assert meta["tokenizer.ggml.token_type"] == [3, 1, 1, 1]
    assert (meta["tokenizer.ggml.eos_token_id"], meta["x.scale"], meta["x.flag"]) == (0, 0.5, True)


def test_not_a_gguf_file_raises(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"NOPE" + bytes(40))
    with pytest.raises(ValueError, match="not a GGUF file"):
        read_gguf_metadata(str(path))
