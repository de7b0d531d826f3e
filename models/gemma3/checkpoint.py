"""Gemma 3 (text) checkpoints: GGUF metadata and config.json translated, llama.cpp tensor names mapped.

llama.cpp stores every Gemma norm weight as (1 + w); the GGUF table takes the
one back (``minus_one``). Which layers slide is a period or, in newer files
and configs, one entry per layer; the sliding layers have their own RoPE base.
"""
from __future__ import annotations

from fuelpipe.masks import FULL, SLIDING
from fuelpipe.weights.architectures import Architecture, TensorRule
from fuelpipe.weights.config_readers import GgufConfigReader, HfConfigReader
from fuelpipe.weights.errors import CheckpointConfigError
from fuelpipe.weights.gguf_transforms import minus_one

# Older gemma3 files do not store these two; llama.cpp then uses these values.
GEMMA3_SLIDING_PATTERN = 6  # every 6th layer global
GEMMA3_LOCAL_ROPE_BASE = 10_000.0  # RoPE base of the sliding layers
GEMMA3_27B_LAYERS = 62  # llama.cpp scales 27B queries by (hidden / heads), every other size by head_dim


def gemma3_gguf_config(m: GgufConfigReader) -> dict:
    key_length, value_length = m.int_("attention.key_length"), m.int_("attention.value_length", 0)
    if value_length and value_length != key_length:
        raise CheckpointConfigError(m.path, f"{m.arch}.attention.value_length {value_length} differs from "
                                            f"key_length {key_length}")
    heads, hidden, layers = m.int_("attention.head_count"), m.int_("embedding_length"), m.int_("block_count")
    softcap = m.float_("final_logit_softcapping", None)
    if m.opt("attn_logit_softcapping") is not None:
        raise CheckpointConfigError(m.path, f"{m.arch}.attn_logit_softcapping is not supported by the gemma3 family")
    return dict(
        vocab_size=m.rows("token_embd.weight"),
        hidden_size=hidden,
        intermediate_size=m.int_("feed_forward_length"),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=m.int_("attention.head_count_kv", heads),
        head_dim=key_length,
        query_pre_attn_scalar=hidden / heads if layers == GEMMA3_27B_LAYERS else key_length,
        rms_norm_eps=m.float_("attention.layer_norm_rms_epsilon"),
        rope_theta=m.float_("rope.freq_base", 1_000_000.0),
        rope_local_base_freq=m.float_("rope.freq_base_swa", GEMMA3_LOCAL_ROPE_BASE),
        rope_scaling=m.rope_scaling(),
        max_position_embeddings=m.int_("context_length"),
        sliding_window=m.int_("attention.sliding_window"),
        **_gemma3_gguf_layer_kinds(m, layers),
        final_logit_softcapping=softcap,
    )


def _gemma3_gguf_layer_kinds(m: GgufConfigReader, layers: int) -> dict:
    """``attention.sliding_window_pattern``: a period, or one bool per layer (true: sliding)."""
    pattern = m.opt("attention.sliding_window_pattern", GEMMA3_SLIDING_PATTERN)
    if isinstance(pattern, int):
        return dict(sliding_window_pattern=pattern)
    if len(pattern) != layers:
        raise CheckpointConfigError(m.path, f"{m.arch}.attention.sliding_window_pattern has {len(pattern)} "
                                            f"entries for {layers} layers")
    return dict(layer_types=tuple(SLIDING if bool(s) else FULL for s in pattern))


def gemma3_hf_config(h: HfConfigReader) -> dict:
    h.require_activation("hidden_activation", ("gelu_pytorch_tanh",))
    if h.opt("attn_logit_softcapping") is not None:
        raise CheckpointConfigError(h.path, "config.json attn_logit_softcapping is not supported by the gemma3 family")
    if not h.opt("tie_word_embeddings", True):
        raise CheckpointConfigError(h.path, "config.json unties the head; the gemma3 family always ties it")
    params = h.cfg.get("rope_parameters") or {}
    if "full_attention" in params:  # transformers 5: one RoPE entry per layer kind
        theta, scaling = HfConfigReader(h.path, {"rope_parameters": params["full_attention"]}).rope()
        local_theta, local_scaling = HfConfigReader(h.path, {"rope_parameters": params["sliding_attention"]}).rope()
        if local_scaling.kind != "none":
            raise CheckpointConfigError(h.path, "RoPE scaling on sliding layers is not supported by the gemma3 family")
    else:
        theta, scaling = h.rope(default_theta=1_000_000.0)
        local_theta = h.float_("rope_local_base_freq", 10_000.0)
    geometry = h.decoder_geometry()
    layer_types = h.opt("layer_types")
    return dict(
        **geometry,
        head_dim=h.int_("head_dim", 256),
        query_pre_attn_scalar=h.float_("query_pre_attn_scalar", 256),
        rms_norm_eps=h.float_("rms_norm_eps", 1e-6),
        rope_theta=theta,
        rope_local_base_freq=local_theta,
        rope_scaling=scaling,
        max_position_embeddings=h.int_("max_position_embeddings", 131072),
        sliding_window=h.int_("sliding_window", 4096),
        sliding_window_pattern=h.int_("sliding_window_pattern", h.int_("_sliding_window_pattern", 6)),
        layer_types=tuple(layer_types) if layer_types is not None else None,
        final_logit_softcapping=h.float_("final_logit_softcapping", None),
    )


# llama.cpp's tensor names -> the family's parameters ({i}: the layer index).
GEMMA3_GGUF_TENSORS = (
    TensorRule("token_embd.weight", "embed_tokens.weight"),
    TensorRule("output_norm.weight", "norm.weight", minus_one),
    TensorRule("blk.{i}.attn_norm.weight", "layers.{i}.input_layernorm.weight", minus_one),
    TensorRule("blk.{i}.attn_q.weight", "layers.{i}.self_attn.q_proj.weight"),
    TensorRule("blk.{i}.attn_k.weight", "layers.{i}.self_attn.k_proj.weight"),
    TensorRule("blk.{i}.attn_v.weight", "layers.{i}.self_attn.v_proj.weight"),
    TensorRule("blk.{i}.attn_output.weight", "layers.{i}.self_attn.o_proj.weight"),
    TensorRule("blk.{i}.attn_q_norm.weight", "layers.{i}.self_attn.q_norm.weight", minus_one),
    TensorRule("blk.{i}.attn_k_norm.weight", "layers.{i}.self_attn.k_norm.weight", minus_one),
    TensorRule("blk.{i}.post_attention_norm.weight", "layers.{i}.post_attention_layernorm.weight", minus_one),
    TensorRule("blk.{i}.ffn_norm.weight", "layers.{i}.pre_feedforward_layernorm.weight", minus_one),
    TensorRule("blk.{i}.post_ffw_norm.weight", "layers.{i}.post_feedforward_layernorm.weight", minus_one),
    TensorRule("blk.{i}.ffn_gate.weight", "layers.{i}.mlp.gate_proj.weight"),
    TensorRule("blk.{i}.ffn_up.weight", "layers.{i}.mlp.up_proj.weight"),
    TensorRule("blk.{i}.ffn_down.weight", "layers.{i}.mlp.down_proj.weight"),
)

GEMMA3_ARCHITECTURE = Architecture("gemma3", "gemma3", ("Gemma3ForCausalLM",), gemma3_gguf_config, gemma3_hf_config,
                                   GEMMA3_GGUF_TENSORS)
