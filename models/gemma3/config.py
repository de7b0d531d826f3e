"""Gemma 3 (text) configuration and the named sizes built from it.

Local and global layers differ in two pieces of data: local ("sliding")
layers attend through ``sliding_window`` and rotate with base
``rope_local_base_freq``; global ("full") layers attend to everything and
rotate with base ``rope_theta``, with ``rope_scaling`` applied to them only.
Unless ``layer_types`` names every layer, layer i is global exactly when
``(i + 1) % sliding_window_pattern == 0`` (pattern 6: five local, one global).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from fuelpipe.config_checks import normalize_layer_types, require_head_groups, require_positive
from fuelpipe.errors import ConfigError
from fuelpipe.masks import FULL, SLIDING
from fuelpipe.rope import RopeScaling

# Per-token data: these reach the step as RoPE rows and are not part of the plan key.
ROPE_FIELDS = ("rope_theta", "rope_local_base_freq", "rope_scaling", "max_position_embeddings")


@dataclass(frozen=True)
class Gemma3Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int = 256
    query_pre_attn_scalar: float = 256  # attention scale is query_pre_attn_scalar ** -0.5
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0  # global layers
    rope_local_base_freq: float = 10_000.0  # local layers
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)  # global layers only
    max_position_embeddings: int = 131072
    sliding_window: int = 4096
    sliding_window_pattern: int = 6
    layer_types: Optional[tuple[str, ...]] = None
    final_logit_softcapping: Optional[float] = None

    def __post_init__(self) -> None:
        require_positive(self, ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
                                "sliding_window", "sliding_window_pattern"))
        require_head_groups(self)
        if self.query_pre_attn_scalar <= 0:
            raise ConfigError(f"Gemma3Config.query_pre_attn_scalar must be > 0, got {self.query_pre_attn_scalar}")
        if self.final_logit_softcapping is not None and self.final_logit_softcapping <= 0:
            raise ConfigError(
                f"Gemma3Config.final_logit_softcapping must be > 0 or None, got {self.final_logit_softcapping}"
            )
        normalize_layer_types(self)

    @property
    def resolved_layer_types(self) -> tuple[str, ...]:
        if self.layer_types is not None:
            return self.layer_types
        p = self.sliding_window_pattern
        return tuple(FULL if (i + 1) % p == 0 else SLIDING for i in range(self.num_hidden_layers))


def gemma3_tiny(**overrides) -> Gemma3Config:
    """Test geometry: six layers (five local, one global), an 8-position window, linear scaling on the global
    layer and a query scale that is not head_dim, so each local/global difference is load-bearing."""
    base = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24,
                max_position_embeddings=512, sliding_window=8, rope_scaling=RopeScaling("linear", 2.0))
    return Gemma3Config(**{**base, **overrides})


def gemma3_1b(**overrides) -> Gemma3Config:
    """Gemma-3-1B geometry: 26 layers, d=1152, 4 heads of 256, 1 KV head, ffn 6912, vocab 262144, window 512."""
    base = dict(vocab_size=262144, hidden_size=1152, intermediate_size=6912, num_hidden_layers=26,
                num_attention_heads=4, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
                rms_norm_eps=1e-6, rope_theta=1_000_000.0, rope_local_base_freq=10_000.0,
                max_position_embeddings=32768, sliding_window=512, sliding_window_pattern=6)
    return Gemma3Config(**{**base, **overrides})
