"""Qwen3 configuration and the named sizes built from it.

Which layers attend through a sliding window follows the checkpoint config's
own semantics: the window is live only when ``use_sliding_window`` is set;
``layer_types``, when given, names each layer's kind; otherwise every layer
from index ``max_window_layers`` on is a sliding layer and the ones before it
attend fully.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from fuelpipe.config_checks import normalize_layer_types, require_head_groups, require_positive
from fuelpipe.errors import ConfigError
from fuelpipe.masks import FULL, SLIDING
from fuelpipe.rope import RopeScaling

# Per-token data: these reach the step as RoPE rows and are not part of the plan key.
ROPE_FIELDS = ("rope_theta", "rope_scaling", "max_position_embeddings")


@dataclass(frozen=True)
class Qwen3Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int = 128
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    use_sliding_window: bool = False
    sliding_window: Optional[int] = 4096
    max_window_layers: int = 28
    layer_types: Optional[tuple[str, ...]] = None

    def __post_init__(self) -> None:
        require_positive(self, ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings"))
        require_head_groups(self)
        normalize_layer_types(self)
        if SLIDING in self.resolved_layer_types and (self.window is None or self.window < 1):
            raise ConfigError(
                f"Qwen3Config: sliding_attention layers need use_sliding_window=True and sliding_window >= 1, "
                f"got use_sliding_window={self.use_sliding_window}, sliding_window={self.sliding_window}"
            )

    @property
    def window(self) -> Optional[int]:
        """The live window: ``sliding_window`` only when ``use_sliding_window`` is set."""
        return self.sliding_window if self.use_sliding_window else None

    @property
    def resolved_layer_types(self) -> tuple[str, ...]:
        if self.layer_types is not None:
            return self.layer_types
        return tuple(
            SLIDING if self.window is not None and i >= self.max_window_layers else FULL
            for i in range(self.num_hidden_layers)
        )


# Llama-3.1 scaling shrunk to a test model: wavelengths below 16 kept, above 64 divided by 8, smoothed between.
TINY_LLAMA3 = RopeScaling("llama3", 8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64)


def qwen3_tiny(**overrides) -> Qwen3Config:
    """Test geometry: two full layers then two 8-position sliding layers, and llama3 RoPE scaling whose
    original context (64) puts the 16-wide head's frequencies in all three bands (kept, smoothed, divided)."""
    base = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                use_sliding_window=True, sliding_window=8, max_window_layers=2, rope_scaling=TINY_LLAMA3)
    return Qwen3Config(**{**base, **overrides})


def qwen3_0_6b(**overrides) -> Qwen3Config:
    """Qwen3-0.6B geometry: 28 layers, d=1024, 16 heads of 128, 8 KV heads, ffn 3072, vocab 151936, tied head."""
    base = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                num_attention_heads=16, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
                rope_theta=1000000.0, max_position_embeddings=40960, tie_word_embeddings=True)
    return Qwen3Config(**{**base, **overrides})
