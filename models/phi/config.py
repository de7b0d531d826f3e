"""Phi configuration (the Phi-3 architecture) and the named sizes built from it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from fuelpipe.config_checks import require_head_groups, require_heads_divide_hidden, require_positive
from fuelpipe.errors import ConfigError

# Per-token data: these reach the step as RoPE rows and are not part of the plan key.
# partial_rotary_factor is NOT here: it fixes the rotated width, a static shape of the program.
ROPE_FIELDS = ("rope_theta", "max_position_embeddings")


@dataclass(frozen=True)
class PhiConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 1.0
    max_position_embeddings: int = 4096
    sliding_window: Optional[int] = None  # when set, every layer attends through this window
    tie_word_embeddings: bool = False

    def __post_init__(self) -> None:
        require_positive(self, ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                "num_attention_heads", "num_key_value_heads", "max_position_embeddings"))
        require_heads_divide_hidden(self)
        require_head_groups(self)
        if not 0.0 < self.partial_rotary_factor <= 1.0:
            raise ConfigError(f"PhiConfig.partial_rotary_factor must lie in (0, 1], got {self.partial_rotary_factor}")
        if self.rotary_dim < 2 or self.rotary_dim % 2:
            raise ConfigError(
                f"PhiConfig: head_dim {self.head_dim} * partial_rotary_factor {self.partial_rotary_factor} "
                f"gives rotary width {self.rotary_dim}; it must be a positive even number"
            )
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ConfigError(f"PhiConfig.sliding_window must be >= 1 or None, got {self.sliding_window}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def rotary_dim(self) -> int:
        """Leading channels of each head that RoPE rotates; the rest pass through."""
        return int(self.head_dim * self.partial_rotary_factor)


def phi_tiny(**overrides) -> PhiConfig:
    """Test geometry: half the head rotated and an 8-position window, so both features are load-bearing."""
    base = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, partial_rotary_factor=0.5,
                sliding_window=8, max_position_embeddings=512)
    return PhiConfig(**{**base, **overrides})


def phi3_mini_4k(**overrides) -> PhiConfig:
    """Phi-3-mini-4k geometry: 32 layers, d=3072, 32 heads (no GQA), ffn 8192, vocab 32064, window 2047."""
    base = dict(vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=32, rms_norm_eps=1e-5, rope_theta=10000.0,
                max_position_embeddings=4096, sliding_window=2047)
    return PhiConfig(**{**base, **overrides})
