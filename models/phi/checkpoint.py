"""Phi-3 checkpoints: config.json translated (HF directories only; no GGUF table yet).

Only part of each head rotates (``partial_rotary_factor``, top level or in
transformers 5's ``rope_parameters``); a config with any RoPE scaling is
refused, naming the scaling kind.
"""
from __future__ import annotations

from fuelpipe.weights.architectures import Architecture
from fuelpipe.weights.config_readers import HfConfigReader
from fuelpipe.weights.errors import CheckpointConfigError


def phi3_hf_config(h: HfConfigReader) -> dict:
    h.require_activation("hidden_act", ("silu",))
    theta, scaling = h.rope()
    if scaling.kind != "none":
        raise CheckpointConfigError(h.path, f"RoPE scaling {scaling.kind!r} is not supported by the phi family")
    params = h.cfg.get("rope_parameters") or {}
    geometry = h.decoder_geometry()
    return dict(
        **geometry,
        rms_norm_eps=h.float_("rms_norm_eps", 1e-5),
        rope_theta=theta,
        partial_rotary_factor=h.float_("partial_rotary_factor", params.get("partial_rotary_factor", 1.0)),
        max_position_embeddings=h.int_("max_position_embeddings", 4096),
        sliding_window=h.int_("sliding_window", None),
        tie_word_embeddings=h.bool_("tie_word_embeddings", False),
    )


PHI3_ARCHITECTURE = Architecture("phi", None, ("Phi3ForCausalLM",), None, phi3_hf_config)
