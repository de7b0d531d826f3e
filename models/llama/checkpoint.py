"""Llama checkpoints (SmolLM2 and kin): GGUF metadata and config.json translated, llama.cpp tensor names mapped.

llama.cpp stores the Q and K rows of each head permuted for its interleaved
RoPE; the GGUF table undoes that (``unpermute_q`` / ``unpermute_k``). A tied
head is a GGUF file without ``output.weight``; biases are present when the
file stores them.
"""
from __future__ import annotations

from fuelpipe.weights.architectures import Architecture, TensorRule, linear_rules
from fuelpipe.weights.config_readers import GgufConfigReader, HfConfigReader
from fuelpipe.weights.errors import CheckpointConfigError
from fuelpipe.weights.gguf_transforms import unpermute_k, unpermute_q


def llama_gguf_config(m: GgufConfigReader) -> dict:
    heads = m.int_("attention.head_count")
    hidden = m.int_("embedding_length")
    key_length = m.int_("attention.key_length", None)
    head_dim = key_length if key_length is not None else hidden // heads
    rotary = m.int_("rope.dimension_count", head_dim)
    if rotary != head_dim:
        raise CheckpointConfigError(
            m.path, f"{m.arch}.rope.dimension_count={rotary} differs from head_dim {head_dim}; "
            "the llama family rotates whole heads"
        )
    return dict(
        vocab_size=m.rows("token_embd.weight"),
        hidden_size=hidden,
        intermediate_size=m.int_("feed_forward_length"),
        num_hidden_layers=m.int_("block_count"),
        num_attention_heads=heads,
        num_key_value_heads=m.int_("attention.head_count_kv", heads),
        head_dim=None if key_length is None else head_dim,
        rms_norm_eps=m.float_("attention.layer_norm_rms_epsilon"),
        rope_theta=m.float_("rope.freq_base", 10000.0),
        rope_scaling=m.rope_scaling(),
        max_position_embeddings=m.int_("context_length"),
        tie_word_embeddings=not m.has_tensor("output.weight"),
        attention_bias=m.has_tensor("blk.0.attn_q.bias"),
        mlp_bias=m.has_tensor("blk.0.ffn_up.bias"),
    )


def llama_hf_config(h: HfConfigReader) -> dict:
    h.require_activation("hidden_act", ("silu",))
    theta, scaling = h.rope()
    geometry = h.decoder_geometry()
    return dict(
        **geometry,
        head_dim=h.int_("head_dim", None),
        rms_norm_eps=h.float_("rms_norm_eps", 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=h.int_("max_position_embeddings", 2048),
        tie_word_embeddings=h.bool_("tie_word_embeddings", False),
        attention_bias=h.bool_("attention_bias", False),
        mlp_bias=h.bool_("mlp_bias", False),
    )


# llama.cpp's tensor names -> the family's parameters ({i}: the layer index).
LLAMA_GGUF_TENSORS = (
    TensorRule("token_embd.weight", "embed_tokens.weight"),
    TensorRule("output_norm.weight", "norm.weight"),
    TensorRule("output.weight", "lm_head.weight"),
    TensorRule("blk.{i}.attn_norm.weight", "layers.{i}.input_layernorm.weight"),
    *linear_rules("blk.{i}.attn_q", "layers.{i}.self_attn.q_proj", unpermute_q),
    *linear_rules("blk.{i}.attn_k", "layers.{i}.self_attn.k_proj", unpermute_k),
    *linear_rules("blk.{i}.attn_v", "layers.{i}.self_attn.v_proj"),
    *linear_rules("blk.{i}.attn_output", "layers.{i}.self_attn.o_proj"),
    TensorRule("blk.{i}.ffn_norm.weight", "layers.{i}.post_attention_layernorm.weight"),
    *linear_rules("blk.{i}.ffn_gate", "layers.{i}.mlp.gate_proj"),
    *linear_rules("blk.{i}.ffn_up", "layers.{i}.mlp.up_proj"),
    *linear_rules("blk.{i}.ffn_down", "layers.{i}.mlp.down_proj"),
)

LLAMA_ARCHITECTURE = Architecture("llama", "llama", ("LlamaForCausalLM",), llama_gguf_config, llama_hf_config,
                                  LLAMA_GGUF_TENSORS)
