"""Check keyword overrides against a family's config dataclass before it is built.

A misspelled name would be a bare ``TypeError`` from the dataclass and a value of the wrong type
(``hidden_size="64"``, ``hidden_size=64.5``) a bare error deep inside the model, or none at all.
Here each is a ``ConfigError`` naming the field, the expected type and the value.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
import typing
from collections.abc import Sequence
from typing import Any

from fuelpipe.errors import ConfigError

_NONE = type(None)


def checked_overrides(config_cls: type, overrides: dict[str, Any], where: str) -> dict[str, Any]:
    """``overrides`` with numbers as Python ``int``/``float``; raises ``ConfigError`` listing every problem."""
    hints = typing.get_type_hints(config_cls)
    names = [f.name for f in dataclasses.fields(config_cls) if f.init]
    out, problems = {}, []
    for key, value in overrides.items():
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1)
            hint = f" did you mean {close[0]!r}?" if close else ""
            problems.append(f"unknown {where} field {key!r};{hint} available: {', '.join(sorted(names))}")
            continue
        ok, value = _coerce(hints[key], value)
        if not ok:
            problems.append(
                f"{where} field {key} must be {_describe(hints[key])}, got {type(value).__name__} {value!r}")
        out[key] = value
    if problems:
        raise ConfigError("; ".join(problems))
    return out


def _coerce(hint: Any, value: Any) -> tuple[bool, Any]:
    """(accepted, value in its canonical Python type) for the annotation ``hint``."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is typing.Union:
        if value is None:
            return _NONE in args, None
        for arg in args:
            if arg is not _NONE:
                ok, coerced = _coerce(arg, value)
                if ok:
                    return True, coerced
        return False, value
    if hint is bool:
        return isinstance(value, bool), value
    if isinstance(value, bool):  # bool is an int to Python, never a size or a rate here
        return False, value
    if hint is int:
        return (True, int(value)) if isinstance(value, numbers.Integral) else (False, value)
    if hint is float:
        ok = isinstance(value, numbers.Real) and math.isfinite(value)
        return (True, float(value)) if ok else (False, value)
    if typing.get_origin(hint) is tuple:
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            return False, value
        elem = args[0] if args else Any
        if elem is not Any and not all(isinstance(v, elem) for v in value):
            return False, value
        return True, tuple(value)
    if isinstance(hint, type):
        return isinstance(value, hint), value
    return True, value


def _describe(hint: Any) -> str:
    if typing.get_origin(hint) is typing.Union:
        return " or ".join("None" if a is _NONE else _describe(a) for a in typing.get_args(hint))
    if typing.get_origin(hint) is tuple:
        args = typing.get_args(hint)
        return f"a sequence of {args[0].__name__}" if args and isinstance(args[0], type) else "a sequence"
    if hint is float:
        return "a finite float"
    return getattr(hint, "__name__", str(hint))
