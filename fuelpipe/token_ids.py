"""Token ids and counts as callers hand them (lists, ranges, numpy arrays, tensors), checked once.

Every public entry point (the context, the batch scheduler, packed prefill, the batch decoder)
turns its arguments into plain ints here, so a float, a bool or an id beyond int64 gets the
same typed ``InputError`` naming the argument, never a torch traceback.
"""
from __future__ import annotations

import numbers
import operator
from typing import Sequence

import torch

from fuelpipe.errors import InputError

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def token_int(value) -> int:
    if isinstance(value, bool) or (isinstance(value, torch.Tensor) and value.dtype == torch.bool):
        raise InputError(f"token ids must be integers, got {value!r}")
    try:
        out = operator.index(value)  # ints, numpy and one-element integer tensors; floats refused, never truncated
    except TypeError:
        raise InputError(f"token ids must be integers, got {type(value).__name__} {value!r}") from None
    if not INT64_MIN <= out <= INT64_MAX:
        raise InputError(f"token id {out} does not fit int64 [{INT64_MIN}, {INT64_MAX}]; token ids must lie in the "
                         "model's vocabulary [0, vocab_size)")
    return out


def token_id_list(values, what: str) -> list[int]:
    """A sequence of token ids (list, tuple, range, numpy array, 1-D tensor) as Python ints."""
    if isinstance(values, torch.Tensor):
        if values.dtype.is_floating_point or values.dtype.is_complex or values.dtype == torch.bool:
            raise InputError(f"{what}: token ids must be integers, got dtype {values.dtype}")
        return [int(v) for v in values.reshape(-1).tolist()]
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise InputError(f"{what} must be a sequence of token ids, got {type(values).__name__} {values!r}")
    return [token_int(v) for v in values]


def count_arg(what: str, value) -> int:
    """A non-negative integer argument (a length, a token count)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InputError(f"{what} must be an integer, got {type(value).__name__} {value!r}")
    if value < 0:
        raise InputError(f"{what} must be >= 0, got {value}")
    return int(value)


def token_id_tensor(token_ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
    if isinstance(token_ids, torch.Tensor):
        t = token_ids
        if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
            raise InputError(f"token ids must be integers, got dtype {t.dtype}")
        return t.reshape(1, -1) if t.dim() <= 1 else t
    return torch.tensor([token_id_list(token_ids, "token_ids")], dtype=torch.int64)
