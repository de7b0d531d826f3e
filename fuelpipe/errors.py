"""Typed errors. Each names the constraint that was violated and the offending value."""
from __future__ import annotations

import enum


class FuelpipeError(Exception):
    """Base class for every error fuelpipe raises on purpose."""


class ConfigError(FuelpipeError, ValueError):
    """A configuration value or combination is invalid."""


class KvCacheError(FuelpipeError, ValueError):
    """A KV-cache operation was refused; the cache is unchanged."""


class KvCapacityError(KvCacheError):
    """A request does not fit the cache's fixed capacity."""


class KvByteLengthError(KvCacheError):
    """A host-bytes write carried the wrong number of bytes."""


class KvNoCapacityError(KvCacheError):
    """The cache has no fixed capacity/dtype, so it has no stable buffer to write into."""


class KvLayerError(KvCacheError):
    """A layer or slot index is out of range or unpopulated."""


class PlanError(FuelpipeError, RuntimeError):
    """A held plan cannot serve the requested step."""


class StalePlanError(PlanError):
    """A held plan was asked to run against a model or cache it does not match."""


class InputError(FuelpipeError, ValueError):
    """Bad user input (token ids, lengths, prompts)."""


class NonFiniteLogitsError(FuelpipeError, ArithmeticError):
    """A step produced NaN or Inf logits; no token is sampled from them."""


class RunInterrupted(KeyboardInterrupt):
    """SIGINT (Ctrl-C) stopped a phase of a run; ``partial`` holds the results sections it had produced.

    A ``KeyboardInterrupt``, not a ``FuelpipeError``: nothing that handles errors may swallow a stop."""

    def __init__(self, partial: dict) -> None:
        super().__init__()
        self.partial = partial


def enum_member(kind: type[enum.Enum], value, key: str) -> enum.Enum:
    """``value`` (a member or its value) as a member of ``kind``; a ``ConfigError`` naming ``key``, the value and
    the choices if it is none of them."""
    if isinstance(value, kind):
        return value
    try:
        return kind(value)
    except ValueError:
        raise ConfigError(f"{key} must be one of {[m.value for m in kind]}, got {value!r}") from None
