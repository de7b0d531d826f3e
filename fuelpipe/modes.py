"""Named choices that the config schema and the runtime both take, each defined once.

The schema types its fields with these enums (a value outside them fails at compose time);
the runtime works on their string values, and derives its tuples of accepted values from
them (``fuelpipe.backbone.OFFSET_MODES``, ``fuelpipe.plan.backends.CACHE_POLICIES``).
Torch-free, so the schema can import it.
"""
from __future__ import annotations

import enum


class OffsetMode(enum.Enum):
    """How a decode step receives the write offset and live length (``plan.offset_mode``)."""

    tensor = "tensor"  # as device tensors: one program serves every position
    symbol = "symbol"  # as host integers, traced as symbols


class CachePolicy(enum.Enum):
    """What a rebuild may reuse (``plan.cache_policy``; inductor only)."""

    cold = "cold"  # no compile caches: every build compiles from scratch
    warm = "warm"  # on-disk / in-memory compile caches may serve a rebuild


def values(choices: type[enum.Enum]) -> tuple[str, ...]:
    """The accepted string values of ``choices``, in definition order."""
    return tuple(member.value for member in choices)
