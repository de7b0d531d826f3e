"""Weight copies a plan derives at build (fused, split, transposed), shared by every plan built from the same tensors.

A batch serves several buckets, each with its own held plan; without sharing,
each would hold its own fused / transposed copy of nearly every weight. A
derived tensor is cached weakly under its recipe (``tag``) and the identity of
its sources (object id, storage address, version counter, shape, dtype,
device). It lives as long as some plan holds it, and every such plan pins the
source tensors it was built from (``WeightsPin``), so no id or address in a
live key can be recycled by another tensor. An in-place write through
``param.data`` bumps no version counter (the same known limit as the plan key),
so ``forget()`` (called by every plan ``drop()``) clears the cache and the next
build derives fresh copies.
"""
from __future__ import annotations

import weakref
from typing import Callable, Iterable, Sequence

import torch

_CACHE: "weakref.WeakValueDictionary[tuple, torch.Tensor]" = weakref.WeakValueDictionary()


def _source_key(t: torch.Tensor) -> tuple:
    return (id(t), t.data_ptr(), t._version, tuple(t.shape), t.dtype, str(t.device))


def derived(tag: str, sources: Sequence[torch.Tensor], make: Callable[[], torch.Tensor]) -> torch.Tensor:
    """The tensor ``make()`` derives from ``sources`` under recipe ``tag``, built once while any plan holds it."""
    key = (tag, tuple(_source_key(t) for t in sources))
    hit = _CACHE.get(key)
    if hit is None:
        hit = make()
        _CACHE[key] = hit
    return hit


def forget() -> None:
    """Derive every copy afresh from now on (plans already built keep theirs)."""
    _CACHE.clear()


def owned_bytes(tensors: Iterable[torch.Tensor], model_storages: set[int]) -> dict[int, int]:
    """storage address -> bytes, for the ``tensors`` whose storage is not one of the model's own."""
    out: dict[int, int] = {}
    for t in tensors:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in model_storages:
            out[ptr] = t.untyped_storage().nbytes()
    return out
