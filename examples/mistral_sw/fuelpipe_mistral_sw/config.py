"""The family's config and its named size."""
from __future__ import annotations

from dataclasses import dataclass

from fuelpipe.errors import ConfigError

# Per-token data: these reach the step as RoPE rows and are not part of the plan key.
ROPE_FIELDS = ("rope_theta", "max_position_embeddings")


@dataclass(frozen=True)
class MistralSwConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    sliding_window: int  # every layer attends only the last ``sliding_window`` positions
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    attention_bias: bool = False
    mlp_bias: bool = False

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "sliding_window", "max_position_embeddings"):
            if getattr(self, name) < 1:
                raise ConfigError(f"MistralSwConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"hidden_size ({self.hidden_size}) must divide by num_attention_heads "
                              f"({self.num_attention_heads})")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                              f"num_key_value_heads ({self.num_key_value_heads})")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


def mistral_sw_tiny(**overrides) -> MistralSwConfig:
    """Test geometry: the window (6) is shorter than the test prompts, so it is load-bearing."""
    base = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, sliding_window=6, max_position_embeddings=512)
    return MistralSwConfig(**{**base, **overrides})
