"""The transformers twin of the Gemma 3 family: ``Gemma3ForCausalLM`` with a RoPE base per layer kind."""
from fuelpipe.family import TransformersTwin
from fuelpipe.oracles.hf_twin import HF_COMMON, geometry, rope_parameters
from models.gemma3.config import Gemma3Config


def _whole(x):
    """A float that holds a whole number as an int: transformers' config fields are typed (a checkpoint's 24.0)."""
    return int(x) if isinstance(x, float) and x.is_integer() else x


def gemma3_hf_config(c: Gemma3Config, tf):
    return tf.Gemma3TextConfig(
        **geometry(c), **HF_COMMON, head_dim=c.head_dim,
        query_pre_attn_scalar=_whole(c.query_pre_attn_scalar),
        hidden_activation="gelu_pytorch_tanh",
        rope_parameters={
            "full_attention": rope_parameters(c.rope_theta, c.rope_scaling),
            "sliding_attention": rope_parameters(c.rope_local_base_freq),
        },
        sliding_window=c.sliding_window, sliding_window_pattern=c.sliding_window_pattern,
        layer_types=list(c.layer_types) if c.layer_types is not None else None,
        final_logit_softcapping=c.final_logit_softcapping, tie_word_embeddings=True,
    )


GEMMA3_TWIN = TransformersTwin(gemma3_hf_config, "Gemma3ForCausalLM")
