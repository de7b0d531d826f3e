"""The family's config and its named size."""
from __future__ import annotations

from dataclasses import dataclass

from fuelpipe.config_checks import require_head_groups, require_heads_divide_hidden, require_positive

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
        require_positive(self, ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                "num_attention_heads", "num_key_value_heads", "sliding_window",
                                "max_position_embeddings"))
        require_heads_divide_hidden(self)
        require_head_groups(self)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


def mistral_sw_tiny(**overrides) -> MistralSwConfig:
    """Test geometry: the window (6) is shorter than the test prompts, so it is load-bearing."""
    base = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, sliding_window=6, max_position_embeddings=512)
    return MistralSwConfig(**{**base, **overrides})
