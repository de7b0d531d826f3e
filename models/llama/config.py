"""Llama configuration and the named sizes built from it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from fuelpipe.config_checks import require_head_groups, require_heads_divide_hidden, require_positive
from fuelpipe.rope import RopeScaling

# Per-token data: these reach the step as RoPE rows and are not part of the plan key.
ROPE_FIELDS = ("rope_theta", "rope_scaling", "max_position_embeddings")


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: Optional[int] = None
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False

    def __post_init__(self) -> None:
        require_positive(self, ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                "num_attention_heads", "num_key_value_heads", "max_position_embeddings"))
        require_head_groups(self)
        if self.head_dim is None:
            require_heads_divide_hidden(self, " when head_dim is not given")

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads


def llama_tiny(**overrides) -> LlamaConfig:
    """Test geometry: two layers, d=64, vocab 256, with linear RoPE scaling so the scaling is load-bearing
    (linear is what a GGUF file can carry; qwen3_tiny and deepseek_v2_tiny exercise llama3 scaling)."""
    base = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                rope_scaling=RopeScaling("linear", 2.0))
    return LlamaConfig(**{**base, **overrides})


def smollm2_135m(**overrides) -> LlamaConfig:
    """SmolLM2-135M geometry: 30 layers, d=576, 9 heads, 3 KV heads, ffn 1536, vocab 49152, tied head."""
    base = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                num_attention_heads=9, num_key_value_heads=3, rms_norm_eps=1e-5, rope_theta=100000.0,
                max_position_embeddings=8192, tie_word_embeddings=True)
    return LlamaConfig(**{**base, **overrides})
