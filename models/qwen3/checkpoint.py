"""Qwen3 checkpoints: config.json translated (HF directories only; no GGUF table yet).

Which layers slide is named by ``layer_types`` or, in older configs, by
``max_window_layers``, both gated by ``use_sliding_window``; all three are
passed on for ``Qwen3Config`` to resolve.
"""
from __future__ import annotations

from fuelpipe.weights.architectures import Architecture
from fuelpipe.weights.config_readers import HfConfigReader


def qwen3_hf_config(h: HfConfigReader) -> dict:
    h.require_activation("hidden_act", ("silu",))
    theta, scaling = h.rope()
    geometry = h.decoder_geometry()
    layer_types = h.opt("layer_types")
    return dict(
        **geometry,
        head_dim=h.int_("head_dim", geometry["hidden_size"] // geometry["num_attention_heads"]),
        rms_norm_eps=h.float_("rms_norm_eps", 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=h.int_("max_position_embeddings", 32768),
        tie_word_embeddings=h.bool_("tie_word_embeddings", False),
        attention_bias=h.bool_("attention_bias", False),
        use_sliding_window=h.bool_("use_sliding_window", False),
        sliding_window=h.int_("sliding_window", None),
        max_window_layers=h.int_("max_window_layers", h.int_("num_hidden_layers")),
        layer_types=tuple(layer_types) if layer_types is not None else None,
    )


QWEN3_ARCHITECTURE = Architecture("qwen3", None, ("Qwen3ForCausalLM",), None, qwen3_hf_config)
