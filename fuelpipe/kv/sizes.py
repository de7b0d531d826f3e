"""Argument checks shared by the cache constructors: sizes are integers, dtypes are floating torch dtypes."""
from __future__ import annotations

import numbers

import torch

from fuelpipe.errors import KvCapacityError


def check_size(owner: str, name: str, value, minimum: int = 1, why: str = "") -> int:
    """``value`` as an int >= ``minimum``, or ``KvCapacityError`` naming ``owner.name`` and the value."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise KvCapacityError(f"{owner}: {name} must be an integer >= {minimum}, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise KvCapacityError(f"{owner}: {name} must be >= {minimum}{why}, got {value}")
    return int(value)


def check_dtype(owner: str, dtype) -> torch.dtype:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise KvCapacityError(f"{owner}: dtype must be a floating torch.dtype (torch.float32, torch.bfloat16, ...), "
                              f"got {dtype!r}")
    return dtype
