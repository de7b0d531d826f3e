"""The transformers twin of the Phi family: ``Phi3ForCausalLM`` (partial rotary, optional window)."""
from fuelpipe.family import TransformersTwin
from fuelpipe.oracles.hf_twin import HF_COMMON, geometry, rope_parameters
from models.phi.config import PhiConfig


def phi_hf_config(c: PhiConfig, tf):
    return tf.Phi3Config(
        **geometry(c), **HF_COMMON,
        rope_parameters=rope_parameters(c.rope_theta, partial_rotary_factor=c.partial_rotary_factor),
        sliding_window=c.sliding_window, tie_word_embeddings=c.tie_word_embeddings,
    )


PHI3_TWIN = TransformersTwin(phi_hf_config, "Phi3ForCausalLM")
