"""The transformers twin of the DeepSeek-V2 family: ``DeepseekV2ForCausalLM`` (MLA, dense or MoE layers).

transformers' config has no "no experts" setting: a dense config gets one
placeholder expert and ``first_k_dense_replace`` past the last layer, so no
layer ever routes.
"""
from fuelpipe.family import TransformersTwin
from fuelpipe.oracles.hf_twin import rope_parameters
from models.deepseek_v2.config import DeepseekV2Config


def deepseek_v2_hf_config(c: DeepseekV2Config, tf):
    moe = c.n_routed_experts > 0
    cfg = tf.DeepseekV2Config(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_attention_heads, kv_lora_rank=c.kv_lora_rank, q_lora_rank=c.q_lora_rank,
        qk_nope_head_dim=c.qk_nope_head_dim, qk_rope_head_dim=c.qk_rope_head_dim, v_head_dim=c.v_head_dim,
        moe_intermediate_size=c.moe_intermediate_size or 1, n_routed_experts=c.n_routed_experts or 1,
        n_shared_experts=c.n_shared_experts or 1, num_experts_per_tok=c.num_experts_per_tok or 1,
        routed_scaling_factor=c.routed_scaling_factor, topk_method=c.topk_method,
        first_k_dense_replace=c.first_k_dense_replace if moe else c.num_hidden_layers,
        rms_norm_eps=c.rms_norm_eps, max_position_embeddings=c.max_position_embeddings,
        rope_parameters=rope_parameters(c.rope_theta, c.rope_scaling), tie_word_embeddings=c.tie_word_embeddings,
        attention_bias=c.attention_bias,
    )
    cfg._attn_implementation = "eager"
    return cfg


DEEPSEEK_V2_TWIN = TransformersTwin(deepseek_v2_hf_config, "DeepseekV2ForCausalLM")
