"""The checks every family's frozen config runs in ``__post_init__``, written once.

A family config states only what is its own (Gemma 3's softcapping, Phi's rotary width, DeepSeek's
latent ranks); the checks that every decoder's geometry shares live here, each raising a
``ConfigError`` that names the config class, the field and the value:

    require_positive(self, ("vocab_size", "hidden_size", ...))
    require_head_groups(self)                    # query heads in whole groups per KV head
    require_heads_divide_hidden(self)            # when head_dim is derived from hidden_size
    normalize_layer_types(self)                  # a YAML list becomes a tuple, length and kinds checked
"""
from __future__ import annotations

from collections.abc import Iterable

from fuelpipe.errors import ConfigError
from fuelpipe.masks import LAYER_TYPES


def _name(config) -> str:
    return type(config).__name__


def require_positive(config, fields: Iterable[str]) -> None:
    """Every named field is an integer count of at least one."""
    for field in fields:
        value = getattr(config, field)
        if value < 1:
            raise ConfigError(f"{_name(config)}.{field} must be >= 1, got {value}")


def require_head_groups(config) -> None:
    """``num_attention_heads`` is a whole multiple of ``num_key_value_heads`` (grouped-query attention)."""
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    if heads % kv_heads:
        raise ConfigError(f"{_name(config)}: num_attention_heads ({heads}) must be a multiple of "
                          f"num_key_value_heads ({kv_heads})")


def require_heads_divide_hidden(config, why: str = "") -> None:
    """``hidden_size`` splits evenly into ``num_attention_heads`` heads (``why`` says when that applies)."""
    if config.hidden_size % config.num_attention_heads:
        raise ConfigError(f"{_name(config)}: hidden_size ({config.hidden_size}) must divide by "
                          f"num_attention_heads ({config.num_attention_heads}){why}")


def normalize_layer_types(config) -> None:
    """A given ``layer_types`` becomes a tuple with one known kind per layer; ``None`` stays ``None``."""
    if config.layer_types is None:
        return
    object.__setattr__(config, "layer_types", tuple(config.layer_types))  # a YAML list arrives as list
    if len(config.layer_types) != config.num_hidden_layers:
        raise ConfigError(f"{_name(config)}.layer_types has {len(config.layer_types)} entries, "
                          f"num_hidden_layers is {config.num_hidden_layers}")
    unknown = sorted(set(config.layer_types) - set(LAYER_TYPES))
    if unknown:
        raise ConfigError(f"{_name(config)}.layer_types: unknown kinds {unknown}; available: {list(LAYER_TYPES)}")
