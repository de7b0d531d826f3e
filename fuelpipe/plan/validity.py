"""What decides whether a held plan may serve a step, and why a rebind is refused.

One comparison list (``PlanKey.compare``) answers Valid / AllocationChanged /
Stale, so "is it valid" and "is only the allocation different" cannot drift.
``AllocationChanged`` only says a guarded rebind is worth attempting; whether
the incoming storage is interchangeable is answered against the storage
actually bound into the plan (``StorageFingerprint``), never the cache's own
description of itself.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional, Protocol

import torch

from fuelpipe.errors import PlanError
from fuelpipe.identity import KvAllocId
from fuelpipe.plan.weights_identity import WeightsIdentity


class PlanValidity(enum.Enum):
    VALID = "valid"
    ALLOCATION_CHANGED = "allocation_changed"
    STALE = "stale"


@dataclass(frozen=True)
class PlanKey:
    """Everything a held plan is baked against.

    ``geometry`` holds strategy-specific shape fields (for a contiguous cache:
    seq and max_seq_len; for a paged pool: max_blocks_cap and block_size).
    ``weights`` is read from the model's tensors themselves (objects, storages,
    version counters: ``fuelpipe.plan.weights_identity``), so a deep copy, a
    ``.data =`` swap, a replaced submodule or an in-place write all make the
    key differ, and a plan holding derived copies of weights (fused or split
    projections) never serves stale numbers.
    """

    geometry: tuple[tuple[str, int], ...]
    n_layers: int
    cache_dtype: torch.dtype
    shape_key: int
    weights: WeightsIdentity
    alloc_id: KvAllocId

    def compare(self, live: "PlanKey") -> PlanValidity:
        structural = (
            self.geometry == live.geometry
            and self.n_layers == live.n_layers
            and self.cache_dtype == live.cache_dtype
            and self.shape_key == live.shape_key
            and self.weights == live.weights
        )
        if not structural:
            return PlanValidity.STALE
        if self.alloc_id != live.alloc_id:
            return PlanValidity.ALLOCATION_CHANGED
        return PlanValidity.VALID

    def differences(self, live: "PlanKey") -> list[str]:
        """Human-readable list of differing fields (for logs and oracle details)."""
        out = []
        for name in ("geometry", "n_layers", "cache_dtype", "shape_key", "alloc_id"):
            a, b = getattr(self, name), getattr(live, name)
            if a != b:
                out.append(f"{name}: held={a} live={b}")
        if self.weights != live.weights:
            out += [f"weights: {change}" for change in self.weights.changes(live.weights)]
        return out


class RefusalReason(enum.Enum):
    RESIDENCY_UNKNOWN = "residency_unknown"
    RESIDENCY_DIFFERS = "residency_differs"
    MISSING_SLOT = "missing_slot"
    UNBAKED_SLOT = "unbaked_slot"
    STORAGE_DIFFERS = "storage_differs"


@dataclass(frozen=True)
class RebindRefusal:
    reason: RefusalReason
    layer: Optional[int] = None
    which: Optional[int] = None
    baked: Optional[str] = None
    incoming: Optional[str] = None

    def __str__(self) -> str:
        parts = [self.reason.value]
        if self.layer is not None:
            parts.append(f"layer={self.layer} slot={self.which}")
        if self.baked is not None or self.incoming is not None:
            parts.append(f"baked={self.baked} incoming={self.incoming}")
        return " ".join(parts)


class RebindRefused(PlanError):
    """A guarded rebind refused; the held plan is untouched."""

    def __init__(self, refusal: RebindRefusal) -> None:
        super().__init__(f"KV rebind refused: {refusal}")
        self.refusal = refusal

    @property
    def reason(self) -> RefusalReason:
        return self.refusal.reason


class KvRebindSource(Protocol):
    """What a guarded rebind needs from a replacement allocation."""

    @property
    def alloc_id(self) -> KvAllocId: ...

    def rebind_location(self) -> Optional[torch.device]:
        """Where the storage provably lives; None means it cannot be proven (a refusal)."""

    def rebind_slot(self, layer: int, which: int) -> Optional[torch.Tensor]:
        """The tensor for ``layer``'s slot ``which`` (0 = K / latent, 1 = V / rope key)."""


@dataclass(frozen=True)
class StorageFingerprint:
    """Everything about a buffer that a baked program depends on and that the tensor itself shows.

    Residency is deliberately absent: it is proven by the cache, not read here.
    """

    dtype: torch.dtype
    layout: torch.layout
    device_type: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int
    nbytes: int

    @classmethod
    def of(cls, t: torch.Tensor) -> "StorageFingerprint":
        return cls(
            dtype=t.dtype,
            layout=t.layout,
            device_type=t.device.type,
            shape=tuple(t.shape),
            stride=tuple(t.stride()),
            storage_offset=t.storage_offset(),
            nbytes=t.untyped_storage().nbytes(),
        )

    def short(self) -> str:
        return f"{self.dtype}/{self.device_type}/{list(self.shape)}/{self.nbytes}B"


def interchangeable(baked: torch.Tensor, incoming: torch.Tensor) -> bool:
    if baked is incoming:
        return True
    return StorageFingerprint.of(baked) == StorageFingerprint.of(incoming)
