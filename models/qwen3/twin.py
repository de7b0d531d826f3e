"""The transformers twin of the Qwen3 family: ``Qwen3ForCausalLM``; transformers derives each layer's kind itself."""
from fuelpipe.family import TransformersTwin
from fuelpipe.oracles.hf_twin import HF_COMMON, geometry, rope_parameters
from models.qwen3.config import Qwen3Config


def qwen3_hf_config(c: Qwen3Config, tf):
    return tf.Qwen3Config(
        **geometry(c), **HF_COMMON, head_dim=c.head_dim,
        rope_parameters=rope_parameters(c.rope_theta, c.rope_scaling),
        tie_word_embeddings=c.tie_word_embeddings, attention_bias=c.attention_bias,
        use_sliding_window=c.use_sliding_window, sliding_window=c.sliding_window,
        max_window_layers=c.max_window_layers,
        layer_types=list(c.layer_types) if c.layer_types is not None else None,
    )


QWEN3_TWIN = TransformersTwin(qwen3_hf_config, "Qwen3ForCausalLM")
