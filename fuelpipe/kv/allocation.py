"""What every KV allocation shows a plan about itself (its never-recycled id and where it provably lives), and the
position bookkeeping of caches whose buffers are allocated up front."""
from __future__ import annotations

from typing import Optional

import torch

from fuelpipe.identity import KvAllocId


class Allocation:
    """Mixin of the caches that own buffers: ``_alloc_id`` (re-minted when the storage is replaced) and
    ``_device_location`` (None means "cannot prove", which a rebind treats as a refusal, never as CPU)."""

    _alloc_id: KvAllocId
    _device_location: Optional[torch.device]

    @property
    def alloc_id(self) -> KvAllocId:
        return self._alloc_id

    @property
    def device_location(self) -> Optional[torch.device]:
        return self._device_location


class UpFrontSequence:
    """Mixin of the one-sequence caches whose buffers hold every position from the start (contiguous,
    latent, ring): growing is only a check against ``check_room`` (each cache's, naming it) and a count,
    and the next request gets this cache, cleared."""

    cached_len: int

    def reserve(self, end: int) -> None:
        """Check that positions [0, end) fit; raise, changing nothing, if not."""
        self.check_room(0, end)

    def advance(self, n: int) -> None:
        """Record that ``n`` more positions were written by a step."""
        self.check_room(self.cached_len, n)
        self.cached_len += n

    def recycle(self):
        """Ready for the next request: ``clear()`` (fresh storage, so a new alloc_id), and this cache serves it.
        (A paged sequence, whose storage is its pool's, answers with a new sequence on the pool instead.)"""
        self.clear()
        return self
