"""DeepSeek-V2 configuration (multi-head latent attention, optional MoE) and named sizes."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from fuelpipe.config_checks import require_positive
from fuelpipe.errors import ConfigError
from fuelpipe.rope import RopeScaling, yarn_mscale

ROPE_FIELDS = ("rope_theta", "rope_scaling", "max_position_embeddings")
TOPK_METHODS = ("greedy",)


@dataclass(frozen=True)
class DeepseekV2Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: Optional[int] = None
    # Mixture of experts (layers >= first_k_dense_replace); n_routed_experts = 0 means all dense.
    moe_intermediate_size: int = 0
    n_routed_experts: int = 0
    n_shared_experts: int = 0
    num_experts_per_tok: int = 0
    routed_scaling_factor: float = 1.0
    first_k_dense_replace: int = 0
    topk_method: str = "greedy"
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False

    def __post_init__(self) -> None:
        require_positive(self, ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                "num_attention_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                                "v_head_dim"))
        if self.q_lora_rank is not None and self.q_lora_rank < 1:
            raise ConfigError(f"DeepseekV2Config.q_lora_rank must be None or >= 1, got {self.q_lora_rank}")
        if self.qk_rope_head_dim % 2:
            raise ConfigError(f"qk_rope_head_dim must be even, got {self.qk_rope_head_dim}")
        if self.topk_method not in TOPK_METHODS:
            raise ConfigError(f"topk_method must be one of {list(TOPK_METHODS)}, got {self.topk_method!r}")
        if self.n_routed_experts:
            if not 0 < self.num_experts_per_tok <= self.n_routed_experts:
                raise ConfigError(
                    f"num_experts_per_tok must be in [1, n_routed_experts={self.n_routed_experts}], "
                    f"got {self.num_experts_per_tok}"
                )
            if self.moe_intermediate_size < 1:
                raise ConfigError(f"moe_intermediate_size must be >= 1 with experts, got {self.moe_intermediate_size}")

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def softmax_scale(self) -> float:
        """qk_head_dim^-0.5, times mscale(factor, mscale_all_dim)^2 under YaRN with mscale_all_dim given.

        DeepSeek-V2 corrects the whole score, not only its rotated part, for the stretched context, so this
        factor lives in the attention, while YaRN's cos/sin factor lives in the RoPE rows.
        """
        s = self.rope_scaling
        correction = yarn_mscale(s.factor, s.mscale_all_dim) ** 2 if s.kind == "yarn" and s.mscale_all_dim else 1.0
        return self.qk_head_dim**-0.5 * correction

    def is_moe_layer(self, index: int) -> bool:
        return self.n_routed_experts > 0 and index >= self.first_k_dense_replace


def deepseek_v2_tiny(**overrides) -> DeepseekV2Config:
    """Two layers, the second a 4-expert MoE (top-2, one shared expert), q_lora_rank set, and llama3 RoPE scaling
    whose original context (64) puts the 8-wide RoPE key's frequencies in all three bands."""
    base = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                kv_lora_rank=32, q_lora_rank=48, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                moe_intermediate_size=32, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                routed_scaling_factor=1.0, first_k_dense_replace=1, max_position_embeddings=512,
                rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 64))
    return DeepseekV2Config(**{**base, **overrides})


def deepseek_v2_tiny_dense(**overrides) -> DeepseekV2Config:
    """Dense MLP on every layer and no q low-rank projection."""
    return deepseek_v2_tiny(**{"q_lora_rank": None, "n_routed_experts": 0, "n_shared_experts": 0,
                                "num_experts_per_tok": 0, "moe_intermediate_size": 0, **overrides})
