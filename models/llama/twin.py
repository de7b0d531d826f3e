"""The transformers twin of the Llama family: ``LlamaForCausalLM`` from the same config inputs."""
from fuelpipe.family import TransformersTwin
from fuelpipe.oracles.hf_twin import HF_COMMON, geometry, rope_parameters
from models.llama.config import LlamaConfig


def llama_hf_config(c: LlamaConfig, tf):
    return tf.LlamaConfig(
        **geometry(c), **HF_COMMON, head_dim=c.resolved_head_dim,
        rope_parameters=rope_parameters(c.rope_theta, c.rope_scaling),
        tie_word_embeddings=c.tie_word_embeddings, attention_bias=c.attention_bias, mlp_bias=c.mlp_bias,
    )


LLAMA_TWIN = TransformersTwin(llama_hf_config, "LlamaForCausalLM")
