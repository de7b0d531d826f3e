"""Weight copies a plan derives at build (fused, split, transposed), shared by every plan built from the same tensors.

A batch serves several buckets, each with its own held plan; without sharing,
each would hold its own fused / transposed copy of nearly every weight. A
derived tensor is cached weakly under its recipe (``tag``) and the identity of
its sources (object id, storage address, version counter, shape, dtype,
device), and an entry answers only while the derived tensor and the very
source objects it names are alive (weak references checked on every hit), so
an id or address recycled by a newcomer never finds another tensor's copy. An in-place write through
``param.data`` bumps no version counter (the same known limit as the plan key),
so ``forget()`` (called by every plan ``drop()``) clears the cache and the next
build derives fresh copies.
"""
from __future__ import annotations

import weakref
from typing import Callable, Iterable, Sequence

import torch

# key -> (weak ref to the derived tensor, weak refs to its sources). An entry serves a build only
# while its derived tensor AND every source it was made from are alive and are the very objects
# named by the key: once a source dies (a fused intermediate dropped from its graph, a replaced
# parameter), a newcomer may take its id and address, and the entry must not answer for it.
_CACHE: dict[tuple, tuple] = {}


def _source_key(t: torch.Tensor) -> tuple:
    return (id(t), t.data_ptr(), t._version, tuple(t.shape), t.dtype, str(t.device))


def derived(tag: str, sources: Sequence[torch.Tensor], make: Callable[[], torch.Tensor]) -> torch.Tensor:
    """The tensor ``make()`` derives from ``sources`` under recipe ``tag``, built once while it and they live."""
    key = (tag, tuple(_source_key(t) for t in sources))
    entry = _CACHE.get(key)
    if entry is not None:
        value, refs = entry[0](), [r() for r in entry[1]]
        if value is not None and all(r is t for r, t in zip(refs, sources)):
            return value
        del _CACHE[key]
    value = make()
    _CACHE[key] = (weakref.ref(value), tuple(weakref.ref(t) for t in sources))
    if len(_CACHE) > 4096:  # drop dead entries now and then
        for k in [k for k, (v, rs) in _CACHE.items() if v() is None or any(r() is None for r in rs)]:
            del _CACHE[k]
    return value


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
