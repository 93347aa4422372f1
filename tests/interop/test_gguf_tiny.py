"""A tiny GGUF written here the way llama.cpp writes one (Q/K rows permuted, untied output.weight,
Q4_0 / Q8_0 / F16 / F32 tensors): our import equals transformers' reading of the same file."""

import gguf
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from t2mlr_jax.formats.tables import hf_layout, to_state_dict
from t2mlr_jax.interop import load_pretrained
from t2mlr_jax.model import backbone
from tests.interop.helpers import tiny_llama_config, transformers_model
from tests.tolerance import assert_fp32_close

Q = gguf.GGMLQuantizationType
# HF key suffix -> (GGUF name, stored type); the types cover every format the importer promises.
TENSORS = {
    "input_layernorm": ("attn_norm", Q.F32),
    "self_attn.q_proj": ("attn_q", Q.Q4_0),
    "self_attn.k_proj": ("attn_k", Q.Q8_0),
    "self_attn.v_proj": ("attn_v", Q.F16),
    "self_attn.o_proj": ("attn_output", Q.Q4_1),
    "post_attention_layernorm": ("ffn_norm", Q.F32),
    "mlp.gate_proj": ("ffn_gate", Q.Q4_0),
    "mlp.up_proj": ("ffn_up", Q.Q8_0),
    "mlp.down_proj": ("ffn_down", Q.F16),
}


def llama_cpp_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter: each head's rotary halves interleaved."""
    out, d_in = weight.shape
    return weight.reshape(heads, 2, out // heads // 2, d_in).swapaxes(1, 2).reshape(out, d_in)


def write_gguf(path, model) -> None:
    config, state = model.config, {k: v.numpy() for k, v in model.state_dict().items()}
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)

    def add(name, array, qtype):
        data = array.astype(np.float16 if qtype == Q.F16 else np.float32)
        if qtype not in (Q.F16, Q.F32):
            data = gguf.quants.quantize(data, qtype)
        writer.add_tensor(name, data, raw_dtype=qtype)

    add("token_embd.weight", state["model.embed_tokens.weight"], Q.Q8_0)
    for i in range(config.num_hidden_layers):
        for suffix, (name, qtype) in TENSORS.items():
            weight = state[f"model.layers.{i}.{suffix}.weight"]
            if name in ("attn_q", "attn_k"):
                heads = config.num_attention_heads if name == "attn_q" else config.num_key_value_heads
                weight = llama_cpp_permute(weight, heads)
            add(f"blk.{i}.{name}.weight", weight, qtype)
    add("output_norm.weight", state["model.norm.weight"], Q.F32)
    add("output.weight", state["lm_head.weight"], Q.Q4_1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.numerics
def test_tiny_gguf_matches_transformers(tmp_path):
    config = tiny_llama_config(kv_heads=2, tied=False)
    config.intermediate_size = 64  # quantized rows come in blocks of 32
    write_gguf(tmp_path / "tiny.gguf", transformers_model(config))
    cfg, params = load_pretrained(tmp_path / "tiny.gguf")
    assert (cfg.num_kv_heads, cfg.tie_embeddings, cfg.rope_theta) == (2, False, 5000.0)
    reference = AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file="tiny.gguf", dtype=torch.float32
    ).eval()
    ours = to_state_dict(hf_layout(cfg), params)
    theirs = {k: v.numpy() for k, v in reference.state_dict().items()}
    assert ours.keys() == theirs.keys() and all(np.array_equal(ours[k], theirs[k]) for k in ours)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 9))
    with torch.no_grad():
        expected = reference(torch.as_tensor(tokens)).logits.numpy()
    # the weights are equal bitwise (above): the logits two fp32 forwards of one model, 3 layers deep
    assert_fp32_close(backbone.forward(cfg, params, jnp.asarray(tokens)), expected, cfg.num_layers, "logits")
