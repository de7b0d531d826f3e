"""Identity of what a held decode plan is baked against.

Two never-recycled process-global counters and one structural hash:

* ``ModelInstanceId``: minted once per constructed model. A counter, not a
  pointer: a pointer can be recycled after the model is freed, and a session
  that outlives its model would then be judged valid for a stranger.
* ``KvAllocId``: minted once per KV allocation (the buffers a plan is welded
  to). Replacing storage re-mints it; rewinding (``truncate_to``) does not.
* ``shape_key``: FNV-1a 64 over a canonical encoding of the family, every
  structure-affecting config field and the model instance id. RoPE
  frequencies and scaling are deliberately absent: they reach the step as
  per-token data, so keying on them would only throw plans away.
"""
from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

_lock = threading.Lock()
_model_counter = itertools.count(1)
_alloc_counter = itertools.count(1)


def _next(counter: itertools.count) -> int:
    with _lock:
        return next(counter)


@dataclass(frozen=True, order=True)
class ModelInstanceId:
    value: int

    @classmethod
    def mint(cls) -> "ModelInstanceId":
        return cls(_next(_model_counter))

    def __str__(self) -> str:
        return f"model#{self.value}"


@dataclass(frozen=True, order=True)
class KvAllocId:
    value: int

    @classmethod
    def mint(cls) -> "KvAllocId":
        return cls(_next(_alloc_counter))

    def __str__(self) -> str:
        return f"kv-alloc#{self.value}"


FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
_MASK64 = (1 << 64) - 1


class ShapeKeyHasher:
    """FNV-1a 64 over a canonical, self-delimiting byte encoding.

    Every value is written as ``tag:len:bytes`` so that ("ab", "c") and
    ("a", "bc") can never collide by concatenation.
    """

    def __init__(self) -> None:
        self._h = FNV_OFFSET

    def _bytes(self, data: bytes) -> None:
        h = self._h
        for b in data:
            h ^= b
            h = (h * FNV_PRIME) & _MASK64
        self._h = h

    def _item(self, tag: str, payload: bytes) -> None:
        self._bytes(f"{tag}:{len(payload)}:".encode())
        self._bytes(payload)

    def value(self, v: Any) -> "ShapeKeyHasher":
        if v is None:
            self._item("n", b"")
        elif isinstance(v, bool):
            self._item("b", b"1" if v else b"0")
        elif isinstance(v, int):
            self._item("i", str(v).encode())
        elif isinstance(v, float):
            self._item("f", v.hex().encode())
        elif isinstance(v, str):
            self._item("s", v.encode())
        elif isinstance(v, (tuple, list)):
            self._item("l", str(len(v)).encode())
            for x in v:
                self.value(x)
        elif isinstance(v, Mapping):
            self.fields(v)
        else:
            raise TypeError(f"shape_key: cannot canonically encode {type(v).__name__} value {v!r}")
        return self

    def field(self, name: str, v: Any) -> "ShapeKeyHasher":
        self._item("k", name.encode())
        return self.value(v)

    def fields(self, mapping: Mapping[str, Any]) -> "ShapeKeyHasher":
        self._item("m", str(len(mapping)).encode())
        for name in sorted(mapping):
            self.field(name, mapping[name])
        return self

    def finish(self) -> int:
        return self._h


def fnv1a64(data: bytes) -> int:
    h = ShapeKeyHasher()
    h._bytes(data)
    return h.finish()


def shape_key(family: str, structure: Mapping[str, Any], instance: ModelInstanceId) -> int:
    """The key a held plan's model identity is compared on."""
    return (
        ShapeKeyHasher()
        .field("family", family)
        .field("structure", dict(structure))
        .field("instance", instance.value)
        .finish()
    )


def structure_fields(config: Any, exclude: Iterable[str]) -> dict[str, Any]:
    """Every dataclass field of ``config`` except the excluded (per-token) ones."""
    from dataclasses import fields, is_dataclass

    if not is_dataclass(config):
        raise TypeError(f"structure_fields needs a dataclass config, got {type(config).__name__}")
    skip = set(exclude)
    out: dict[str, Any] = {}
    for f in fields(config):
        if f.name in skip:
            continue
        v = getattr(config, f.name)
        if is_dataclass(v):
            v = structure_fields(v, ())
        out[f.name] = v
    return out
